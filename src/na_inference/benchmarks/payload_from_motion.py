"""How much payload does each SO-101 NAD trial's telemetry say the arm carried?

A check on the labels, independent of the network. A held still servo's load sits anywhere in its
gearbox's static-friction band, so a hold alone does not fix the payload. While a joint moves, friction
has a known sign. On the labelled frames where joint j moves (|velocity| > 0.05 rad/s), fit over the
training trials (known mass m):

    load_j = c0 + c1 * g_j(q) + c2 * m * u_j(q) + c3 * sign(qd_j) + c4 * qd_j

g_j is the arm's own gravity torque and u_j the torque that 1 kg at the grasp site needs (our
dynamics). Then, per trial, solve the same model for m by least squares with the fitted c. Run:

    python src/na_inference/benchmarks/payload_from_motion.py --nad-dir ../shared/nad

``--observer`` also scores this physics as a causal force estimator on the held-out files: during each
contact, the mass is the least-squares solution over the moving frames of that contact so far, and the
z force is -9.81 m. Contact comes from the labels (perfect timing, an upper bound for this physics;
the ridge's force is the prior until the arm has moved), and with ``--model`` also from that ONNX
model's deployment gate, with the model's force as the prior. A prior weighs as much as 20 typical
moving frames. The network's and the ridge's numbers on the same files come with it.
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
GRAVITY = 9.81
#: a contact ends after this many frames without one (the observer then forgets the contact's mass)
RESET_AFTER = 30


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


def observe_payload(traj: Trajectory, arm: np.ndarray, per_kg: np.ndarray, coefficients: dict[int, np.ndarray],
                    contact: np.ndarray, prior_kg: np.ndarray | None = None, prior_weight: float = 0.0) -> np.ndarray:
    """Causal payload mass [T] (kg), 0 outside contact.

    Within a contact, m is the least-squares solution of the load model over the moving frames seen
    so far (with ``prior_weight`` pseudo-frames at ``prior_kg``, which is 0 kg when not given).
    """
    velocity, load = traj.quantities["velocity"], traj.quantities["load"]
    mass = np.zeros(len(traj))
    moment = weight = 0.0
    idle = RESET_AFTER
    for i in range(len(traj)):
        if not contact[i]:
            idle += 1
            if idle >= RESET_AFTER:
                moment = weight = 0.0
            continue
        idle = 0
        for joint in JOINTS:
            v = velocity[i, joint]
            if abs(v) > MOVING:
                c = coefficients[joint]
                slope = c[2] * per_kg[i, joint]
                moment += slope * (load[i, joint] - c[0] - c[1] * arm[i, joint] - c[3] * np.sign(v) - c[4] * v)
                weight += slope * slope
        prior = 0.0 if prior_kg is None else prior_kg[i]
        if weight + prior_weight > 0:
            mass[i] = max(0.0, (prior_weight * prior + moment) / (prior_weight + weight))
    return mass


def force_scores(force: np.ndarray, traj: Trajectory) -> tuple[float, float]:
    """(MAE over all frames and 3 axes, z MAE over labelled frames), as na-eval scores them."""
    labelled = traj.force_labelled
    return (float(np.abs(force - traj.force_or_zero()).mean()),
            float(np.abs(force[labelled, 2] - traj.force[labelled, 2]).mean()))


def score_observer(args: argparse.Namespace, dyn: RigidBodyDynamics, loaded: dict[Path, Trajectory],
                   terms: dict, coefficients: dict[int, np.ndarray], train_paths: list[Path],
                   val_paths: list[Path]) -> None:
    """Force scores of the causal observer on the held-out files, next to the network's and the ridge's."""
    from na_inference.baselines import RidgeForce
    from na_inference.evaluate import deployment_forces
    from na_inference.features import default_spec, fit_normalization

    base = default_spec("so101")
    spec = fit_normalization(base, [base.frames(loaded[p]) for p in train_paths])
    ridge = RidgeForce(spec).fit([loaded[p] for p in train_paths])
    # the prior's weight in frames of a typical squared slope of the training trials
    typical = np.mean(np.concatenate([(coefficients[j][2] * terms[p][1][:, j]) ** 2
                                      for p in train_paths for j in JOINTS]))
    columns = ["observer, label timing, ridge prior", "ridge"]
    if args.model is not None:
        columns += ["observer, model's gate and prior", "model (deployment)"]
    print("\nForce MAE all frames / z labelled (N) on the held-out files\n")
    print("| trial | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    scores = []
    for p in val_paths:
        traj, (arm, per_kg) = loaded[p], terms[p]
        row = []
        ridge_force, ridge_gate = ridge.predict(traj)
        ridge_kg = np.maximum(0.0, -ridge_force[:, 2] / np.maximum(ridge_gate, 1e-3) / GRAVITY)  # ungated
        mass = observe_payload(traj, arm, per_kg, coefficients, traj.force_labelled,
                               prior_kg=ridge_kg, prior_weight=20 * typical)
        force = np.zeros((len(traj), 3))
        force[:, 2] = -GRAVITY * mass
        row.append(force_scores(force, traj))
        row.append(force_scores(ridge_force, traj))
        if args.model is not None:
            net_force, gate = deployment_forces(args.model, traj)
            contact = gate > 0.5
            mass = observe_payload(traj, arm, per_kg, coefficients, contact,
                                   prior_kg=np.maximum(0.0, -net_force[:, 2] / GRAVITY), prior_weight=20 * typical)
            force = np.where(contact[:, None], net_force, 0.0)
            force[contact, 2] = -GRAVITY * mass[contact]
            row.append(force_scores(force, traj))
            row.append(force_scores(net_force, traj))
        scores.append(row)
        name = "/".join(p.parts[-4:-2]) + "/" + p.name
        print(f"| {name} | " + " | ".join(f"{a:.3f} / {z:.3f}" for a, z in row) + " |")
    mean = np.mean(scores, axis=0)
    print("| **mean** | " + " | ".join(f"**{a:.3f} / {z:.3f}**" for a, z in mean) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nad-dir", type=Path, default=Path("../shared/nad"))
    parser.add_argument("--holdout-fold", type=int, default=-1, help="as na-train: which file per task is held out")
    parser.add_argument("--observer", action="store_true",
                        help="also score the physics as a causal force estimator on the held-out files")
    parser.add_argument("--model", type=Path, help="with --observer: an ONNX model whose deployment gate gives contact")
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
    if args.observer:
        score_observer(args, dyn, loaded, terms, coefficients, train_paths, val_paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
