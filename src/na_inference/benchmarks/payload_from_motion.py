"""How much payload does each SO-101 NAD trial's telemetry say the arm carried, and how well does the
payload observer (na_inference/payload.py) turn that into a force?

A check on the labels, independent of the network. A held still servo's load sits anywhere in its
gearbox's static-friction band, so a hold alone does not fix the payload. While a joint moves, friction
has a known sign. On the labelled frames where joint j moves, the observer's load model is fitted over
the training trials (known mass m):

    load_j = c0 + c1 * g_j(q) + c2 * m * u_j(q) + c3 * sign(qd_j) + c4 * qd_j

g_j is the arm's own holding torque and u_j the torque that 1 kg at the end effector applies. Then,
per trial, the same model is solved for m over all its labelled moving frames (not causal). Run:

    python src/na_inference/benchmarks/payload_from_motion.py --nad-dir ../shared/nad

``--observer`` also scores the causal observer as a force estimator on the held-out files, with the
contact from the labels (perfect timing, the ridge's force as the prior until the arm has moved: the
best this physics can do) next to the ridge, and with ``--model`` the runtime engine (what the node
publishes) with and without the observer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from na_description.robot_table import load_robot
from na_inference.kinematics import GravityModel
from na_inference.nad import Trajectory, find_trajectories, holdout_split, load_trajectory
from na_inference.payload import (
    GRAVITY,
    PayloadObserver,
    PayloadObserverConfig,
    load_model_rows,
    observe_trajectory,
)


def force_scores(force: np.ndarray, traj: Trajectory) -> tuple[float, float]:
    """(MAE over all frames and 3 axes, z MAE over labelled frames), as na-eval scores them."""
    labelled = traj.force_labelled
    return (float(np.abs(force - traj.force_or_zero()).mean()),
            float(np.abs(force[labelled, 2] - traj.force[labelled, 2]).mean()))


def trial_masses(traj: Trajectory, gravity: GravityModel, config: PayloadObserverConfig) -> list[str]:
    """Per fitted joint and for all together: the mass (kg) the trial's labelled moving frames imply."""
    cells, num, den = [], 0.0, 0.0
    rows = load_model_rows(traj, gravity, config.joints, config.moving_velocity, traj.force_labelled)
    for c, (x, y) in zip(config.coefficients, rows):
        residual = y - x[:, [0, 1, 3, 4]] @ c[[0, 1, 3, 4]]
        slope = c[2] * x[:, 2]
        cells.append(f"{slope @ residual / (slope @ slope):.3f} ({len(y)})" if len(y) else "-")
        num, den = num + slope @ residual, den + slope @ slope
    return [*cells, f"{num / den:.3f}"]


def score_observer(model: Path | None, observer: PayloadObserver, loaded: dict[Path, Trajectory],
                   train_paths: list[Path], val_paths: list[Path]) -> None:
    """Force scores on the held-out files: observer with label timing, ridge, and the engine."""
    from na_inference.baselines import RidgeForce
    from na_inference.evaluate import deployment_forces
    from na_inference.features import default_spec, fit_normalization

    base = default_spec("so101")
    spec = fit_normalization(base, [base.frames(loaded[p]) for p in train_paths])
    ridge = RidgeForce(spec).fit([loaded[p] for p in train_paths])
    columns = ["observer, label timing, ridge prior", "ridge"]
    if model is not None:
        columns += ["engine with the observer", "engine, network only"]
    print("\nForce MAE all frames / z labelled (N) on the held-out files\n")
    print("| trial | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    scores = []
    for path in val_paths:
        traj = loaded[path]
        ridge_force, ridge_gate = ridge.predict(traj)
        ridge_kg = np.maximum(0.0, -ridge_force[:, 2] / np.maximum(ridge_gate, 1e-3) / GRAVITY)  # ungated
        mass, _ = observe_trajectory(observer, traj, prior_kg=ridge_kg, contact=traj.force_labelled)
        force = np.zeros((len(traj), 3))
        force[:, 2] = -GRAVITY * mass
        row = [force_scores(force, traj), force_scores(ridge_force, traj)]
        if model is not None:
            for use in (observer, False):
                row.append(force_scores(deployment_forces(model, traj, payload_observer=use)[0], traj))
        scores.append(row)
        print(f"| {'/'.join(path.parts[-4:-2])}/{path.name} | " + " | ".join(f"{a:.3f} / {z:.3f}" for a, z in row)
              + " |")
    mean = np.mean(scores, axis=0)
    print("| **mean** | " + " | ".join(f"**{a:.3f} / {z:.3f}**" for a, z in mean) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nad-dir", type=Path, default=Path("../shared/nad"))
    parser.add_argument("--holdout-fold", type=int, default=-1, help="as na-train: which file per task is held out")
    parser.add_argument("--observer", action="store_true",
                        help="also score the causal observer as a force estimator on the held-out files")
    parser.add_argument("--model", type=Path,
                        help="with --observer: an ONNX model to run through the engine with and without it")
    args = parser.parse_args(argv)
    table = load_robot("so101")
    train_paths, val_paths = holdout_split(find_trajectories(args.nad_dir, "so101"), fold=args.holdout_fold)
    loaded = {p: load_trajectory(p) for p in train_paths + val_paths}
    observer = PayloadObserver.for_robot(table).refitted([loaded[p] for p in train_paths])
    gravity, config, coefficients = observer.gravity, observer.config, observer.config.coefficients
    names = [table.joint_names[j] for j in config.joints]
    for name, c in zip(names, coefficients):
        print(f"{name}: c = {np.round(c, 3)}")
    print("\n| split | trial | label (kg) | " + " | ".join(f"{n} (kg, frames)" for n in names)
          + " | all joints (kg) |")
    print("|---|---|---|" + "---|" * (len(names) + 1))
    for path, traj in loaded.items():
        split = "held out" if path in val_paths else "train"
        print(f"| {split} | {'/'.join(path.parts[-4:-2])}/{path.name} | {traj.payload_kg} | "
              + " | ".join(trial_masses(traj, gravity, config)) + " |")
    if args.observer:
        score_observer(args.model, observer, loaded, train_paths, val_paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
