"""How much payload does each SO-101 NAD trial's telemetry say the arm carried?

A check on the labels, independent of the network. A held still servo's load sits anywhere in its
gearbox's static-friction band, so a hold alone does not fix the payload. While a joint moves, friction
has a known sign. On the labelled frames where joint j moves (|velocity| > 0.05 rad/s), fit over the
training trials (known mass m):

    load_j = c0 + c1 * g_j(q) + c2 * m * u_j(q) + c3 * sign(qd_j) + c4 * qd_j

g_j is the arm's own gravity torque and u_j the torque that 1 kg at the grasp site needs (our
dynamics). Then, per trial, solve the same model for m by least squares with the fitted c. Run:

    python src/na_inference/benchmarks/payload_from_motion.py --nad-dir ../shared/nad
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from na_inference.dynamics import RigidBodyDynamics
from na_inference.nad import Trajectory, find_trajectories, holdout_split, load_trajectory

JOINTS = (1, 2, 3)            # shoulder_lift, elbow_flex, wrist_flex: the joints the payload loads
MOVING = 0.05                 # rad/s


def gravity_terms(dyn: RigidBodyDynamics, traj: Trajectory) -> tuple[np.ndarray, np.ndarray]:
    """([T, n] arm gravity torque, [T, n] torque per kg of payload at the grasp site)."""
    q = torch.tensor(traj.quantities["position"], dtype=torch.float64)
    arm = dyn.bias_forces(q, torch.zeros_like(q)).numpy()
    per_kg = -9.81 * dyn.site_jacobian(q).numpy()[:, 2, :]
    return arm, per_kg


def moving_rows(traj: Trajectory, arm: np.ndarray, per_kg: np.ndarray, joint: int) -> tuple[np.ndarray, np.ndarray]:
    """Regressors [n, 5] (payload column per kg) and loads [n] of the labelled frames where ``joint`` moves."""
    vel = traj.quantities["velocity"][:, joint]
    rows = traj.force_labelled & (np.abs(vel) > MOVING)
    x = np.stack([np.ones(rows.sum()), arm[rows, joint], per_kg[rows, joint], np.sign(vel[rows]), vel[rows]], 1)
    return x, traj.quantities["load"][rows, joint]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nad-dir", type=Path, default=Path("../shared/nad"))
    parser.add_argument("--holdout-fold", type=int, default=-1, help="as na-train: which file per task is held out")
    args = parser.parse_args(argv)
    dyn = RigidBodyDynamics.for_robot("so101")
    train_paths, val_paths = holdout_split(find_trajectories(args.nad_dir, "so101"), fold=args.holdout_fold)
    loaded = {p: load_trajectory(p) for p in train_paths + val_paths}
    terms = {p: gravity_terms(dyn, t) for p, t in loaded.items()}
    coefficients = {}
    for joint in JOINTS:
        xs, ys = [], []
        for p in train_paths:
            x, y = moving_rows(loaded[p], *terms[p], joint)
            x[:, 2] *= loaded[p].payload_kg
            xs.append(x)
            ys.append(y)
        x, y = np.concatenate(xs), np.concatenate(ys)
        coefficients[joint], *_ = np.linalg.lstsq(x, y, rcond=None)
        print(f"joint {joint}: c = {np.round(coefficients[joint], 3)}, residual std "
              f"{np.std(y - x @ coefficients[joint]):.3f} duty over {len(y)} moving frames")
    print("\n| split | trial | label (kg) | " + " | ".join(f"joint {j} (kg, frames)" for j in JOINTS)
          + " | all joints (kg) |")
    print("|---|---|---|" + "---|" * (len(JOINTS) + 1))
    for p, traj in loaded.items():
        cells, num, den = [], 0.0, 0.0
        for joint in JOINTS:
            x, y = moving_rows(traj, *terms[p], joint)
            c = coefficients[joint]
            residual = y - x[:, [0, 1, 3, 4]] @ c[[0, 1, 3, 4]]
            slope = c[2] * x[:, 2]
            cells.append(f"{slope @ residual / (slope @ slope):.3f} ({len(y)})" if len(y) else "-")
            num, den = num + slope @ residual, den + slope @ slope
        split = "held out" if p in val_paths else "train"
        name = "/".join(p.parts[-4:-2]) + "/" + p.name
        print(f"| {split} | {name} | {traj.payload_kg} | " + " | ".join(cells) + f" | {num / den:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
