"""``na-eval``: the published SO-101 protocol and deployment-mode metrics, with the baselines in one table.

(a) Rollout protocol (method.md, needs the torch checkpoint): one open-loop rollout per trajectory from row
    0, qvel 0, mean-frame (zero) history, no noise or dropout; joint MAE in degrees (sim q after step i vs
    recorded pos[i+1]) and force MAE over ALL frames and 3 axes with -999 read as 0 (the force of step i
    vs the label of row i+1), over the first 100/300/500 steps and the full trajectory; plus the z-force
    MAE over labelled frames and the gate accuracy (contact probability > 0.5 vs |f| > 0.01 N).
(b) Deployment mode (needs the exported ONNX model): every telemetry row goes through the runtime's own
    ``InferenceEngine`` (ONNX Runtime, HistoryWindow, its time grid, the payload observer as the node runs
    it): no simulator, telemetry only. The estimate for row i is the engine's latest output after that row
    (what the node has published at that stamp) and is compared with the label of row i.
    ``--payload-observer``: the robot table's (as the node), ``refit`` on the evaluated split's training
    files (cross-validation: the table's was fitted on the shipped split), or ``off`` (the network alone).
(c) Baselines (ridge, ID-Linear, momentum observer), fitted on the training files, scored like (b).

Writes OUT_DIR/metrics.json, OUT_DIR/metrics.md and PNG plots (force vs label over time; rolled-out vs
recorded joints).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from na_description.robot_table import load_robot

from .baselines import IDLinear, MomentumObserver, RidgeForce, force_targets
from .contract import read_model_file
from .dynamics import RigidBodyDynamics
from .engine import InferenceEngine, SampleStatus
from .features import FeatureSpec, default_spec, fit_normalization
from .model import load_checkpoint
from .nad import Trajectory, find_trajectories, holdout_split, load_trajectory
from .payload import PayloadObserver
from .rollout import FeatureMixer, prefix_mae, prepare, protocol_rollouts

PREFIXES = (100, 300, 500)
GATE_PROBABILITY = 0.5
# method.md, "Published numbers": the reference on the NAD SO-101 test split (6 tasks, full trajectories).
PUBLISHED_SO101 = {"worst_joint_deg": 1.52, "force_mae_all": 0.22, "id_linear_force": 1.41,
                   "momentum_observer_force": 0.66, "neuralactuator_force_paper": 0.12}


def force_metrics(pred: np.ndarray, traj: Trajectory, rows: slice, gate: np.ndarray | None) -> dict[str, Any]:
    """Force metrics of ``pred`` [n, 3] against the labels of ``traj`` rows ``rows``."""
    label_all = traj.force_or_zero()[rows]
    fz = traj.force[rows, 2]
    labelled = ~np.isnan(fz)
    _, _, contact = force_targets(traj)
    out: dict[str, Any] = {"force_mae_all": prefix_mae(np.abs(pred - label_all), PREFIXES)}
    out["force_z_mae_labelled"] = float(np.abs(pred[labelled, 2] - fz[labelled]).mean()) if labelled.any() else None
    out["force_abs_unlabelled"] = float(np.abs(pred[~labelled]).mean()) if (~labelled).any() else None
    if gate is not None:
        out["gate_accuracy"] = float(np.mean((gate > GATE_PROBABILITY) == contact[rows]))
    return out


# ---------------------------------------------------------------------------------------------- (a) rollout

def evaluate_rollouts(checkpoint: Path, trajs: list[Trajectory], substeps: int | None = None,
                      apply_force: bool | None = None) -> tuple[list[dict[str, Any]], list[dict[str, np.ndarray]]]:
    """Protocol rollouts; ``substeps``/``apply_force`` None = as the checkpoint was trained (else 5 / off)."""
    net, _, spec, extra = load_checkpoint(checkpoint)
    trained = extra.get("training", {}).get("config", {})
    substeps = int(trained.get("substeps", 5)) if substeps is None else substeps
    apply_force = bool(trained.get("apply_force", False)) if apply_force is None else apply_force
    net.eval()
    dyn = RigidBodyDynamics.for_robot(spec.robot, dtype=torch.float32)
    mixer = FeatureMixer(spec)
    prepared = [prepare(t, spec) for t in trajs]
    outs = protocol_rollouts(net, dyn, mixer, prepared, spec.dt, substeps, apply_force)
    results, series = [], []
    for traj, prep, out in zip(trajs, prepared, outs):
        q = out.q[0].numpy()
        err_deg = np.degrees(np.abs(q - prep.position[1:]))
        per_joint = {n: float(v) for n, v in zip(spec.joint_names, err_deg.mean(axis=0))}
        joint = {key: float(err_deg[:n].mean(axis=0).max()) for key, n in
                 [(f"first_{p}", p) for p in PREFIXES if p <= len(err_deg)] + [("full", len(err_deg))]}
        gate = torch.sigmoid(out.gate_logit[0, :, 0]).numpy()
        metrics = {"worst_joint_mae_deg": joint, "joint_mae_deg": per_joint,
                   "mean_joint_mae_deg": prefix_mae(err_deg, PREFIXES)}
        metrics.update(force_metrics(out.force[0].numpy(), traj, slice(1, None), gate))
        results.append(metrics)
        series.append({"q": q, "force": out.force[0].numpy()})
    return results, series


# ---------------------------------------------------------------------------------------------- (b) deployment

def deployment_forces(model: Path, traj: Trajectory, payload_observer: bool | PayloadObserver = True,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Feed the trajectory row by row through the runtime engine; (force [T, 3], contact probability [T])."""
    engine = InferenceEngine(model, traj.robot, payload_observer=payload_observer)
    force = np.zeros((len(traj), 3))
    gate = np.zeros(len(traj))
    last_force, last_gate = np.zeros(3), 0.0
    names = engine.quantities
    for i, stamp in enumerate(traj.time):
        sample = {q: np.asarray(traj.quantities[q][i]) for q in names}
        result = engine.step(float(stamp), sample)
        if result.status is SampleStatus.INFERRED and result.output is not None:
            last_force, last_gate = result.output.force, result.output.contact_probability
        force[i], gate[i] = last_force, last_gate
    return force, gate


def evaluate_deployment(model: Path, trajs: list[Trajectory], payload_observer: bool | PayloadObserver = True,
                        ) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    results, series = [], []
    for traj in trajs:
        force, gate = deployment_forces(model, traj, payload_observer)
        results.append(force_metrics(force, traj, slice(0, None), gate))
        series.append(force)
    return results, series


# ---------------------------------------------------------------------------------------------- (c) baselines

def evaluate_baselines(train: list[Trajectory], trajs: list[Trajectory], spec: FeatureSpec,
                       names: tuple[str, ...] = ("ridge", "id_linear", "momentum_observer"),
                       ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[np.ndarray]]]:
    dt = load_robot(spec.robot).data_dt
    makers = {"ridge": lambda: RidgeForce(spec), "id_linear": lambda: IDLinear(spec.robot, dt),
              "momentum_observer": lambda: MomentumObserver(IDLinear(spec.robot, dt))}
    results: dict[str, list[dict[str, Any]]] = {}
    series: dict[str, list[np.ndarray]] = {}
    for name in names:
        estimator = makers[name]().fit(train)
        results[name], series[name] = [], []
        for traj in trajs:
            force, gate = estimator.predict(traj)
            results[name].append(force_metrics(force, traj, slice(0, None), gate))
            series[name].append(force)
    return results, series


# ---------------------------------------------------------------------------------------------- summary

def mean_over(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over trajectories of every (nested) number; None entries are skipped."""
    out: dict[str, Any] = {}
    for key in results[0]:
        values = [r[key] for r in results if r.get(key) is not None]
        if not values:
            out[key] = None
        elif isinstance(values[0], dict):
            out[key] = mean_over(values)
        else:
            out[key] = float(np.mean(values))
    return out


def markdown_table(summary: dict[str, Any]) -> str:
    """One row per method: force MAE (all frames, 3 axes), z labelled, gate accuracy, worst-joint MAE."""
    lines = ["| method | force MAE all frames, 3 axes (N) | z-force MAE labelled (N) | gate accuracy | "
             "worst-joint rollout MAE (deg) |", "|---|---|---|---|---|"]

    def fmt(value: Any, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for name, res in summary["methods"].items():
        worst = res.get("worst_joint_mae_deg", {}).get("full") if "worst_joint_mae_deg" in res else None
        lines.append(f"| {name} | {fmt(res['force_mae_all']['full'])} | {fmt(res.get('force_z_mae_labelled'))} | "
                     f"{fmt(res.get('gate_accuracy'))} | {fmt(worst, 2)} |")
    if summary.get("robot") == "so101":
        pub = PUBLISHED_SO101
        lines.append(f"| reference, published (NAD test split) | {pub['force_mae_all']} | - | - | "
                     f"{pub['worst_joint_deg']} |")
        lines.append(f"| ID-Linear / momentum observer, published | {pub['id_linear_force']} / "
                     f"{pub['momentum_observer_force']} | - | - | - |")
    if summary.get("payload_observer"):
        lines += ["", f"Deployment with the payload observer: {summary['payload_observer']} "
                      "(table = the robot table's, as the node runs it; refit = fitted on this split's training "
                      "files; off = the network alone)."]
    if "rollout" in summary["methods"]:
        lines += ["", "Rollout protocol by prefix (mean over trajectories):", "",
                  "| prefix | worst-joint MAE (deg) | mean joint MAE (deg) | force MAE all (N) |", "|---|---|---|---|"]
        res = summary["methods"]["rollout"]
        for key in res["worst_joint_mae_deg"]:
            lines.append(f"| {key} | {res['worst_joint_mae_deg'][key]:.2f} | {res['mean_joint_mae_deg'][key]:.2f} | "
                         f"{res['force_mae_all'][key]:.3f} |")
    return "\n".join(lines) + "\n"


def plot(out_dir: Path, trajs: list[Trajectory], names: list[str], force_series: dict[str, list[np.ndarray]],
         rollouts: list[dict[str, np.ndarray]] | None, joint_names: tuple[str, ...]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(len(trajs), 1, figsize=(10, 2.2 * len(trajs)), squeeze=False)
    for ax, traj, name, k in zip(axes[:, 0], trajs, names, range(len(trajs))):
        t = traj.time - traj.time[0]
        ax.plot(t, traj.force_or_zero()[:, 2], "k", lw=2, label="label z (-999 as 0)")
        for method, series in force_series.items():
            values = series[k]
            tt = t[1:] if method == "rollout" else t
            ax.plot(tt, values[:, 2], lw=1, label=f"{method} z")
        ax.set_title(name, fontsize=8)
        ax.set_ylabel("N")
    axes[0, 0].legend(fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    path = out_dir / "force_vs_label.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)
    if rollouts:
        n_j = len(joint_names)
        fig, axes = plt.subplots(len(trajs), n_j, figsize=(2.6 * n_j, 1.9 * len(trajs)), squeeze=False)
        for k, (traj, roll) in enumerate(zip(trajs, rollouts)):
            t = traj.time - traj.time[0]
            for j in range(n_j):
                ax = axes[k, j]
                ax.plot(t, np.degrees(traj.quantities["position"][:, j]), "k", lw=1.5, label="recorded")
                ax.plot(t[1:], np.degrees(roll["q"][:, j]), "r", lw=1, label="rollout")
                if k == 0:
                    ax.set_title(joint_names[j], fontsize=8)
                ax.tick_params(labelsize=6)
            axes[k, 0].set_ylabel(names[k].split("/")[-3] if "/" in names[k] else names[k], fontsize=6)
        axes[0, 0].legend(fontsize=6)
        fig.tight_layout()
        path = out_dir / "rollout_joints.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def select_files(nad_dir: Path, robot: str, split: str, fold: int = -1) -> tuple[list[Path], list[Path]]:
    """(training files for the baselines, evaluation files). ``holdout``: one file per task held out of
    the train split (file ``fold`` of each task, -1 the last, as na-train does); ``validation``/``test``:
    the release's own split."""
    train_all = find_trajectories(nad_dir, robot, split="train")
    if split == "holdout":
        return holdout_split(train_all, fold=fold)
    return train_all, find_trajectories(nad_dir, robot, split=split)


def trained_holdout_fold(checkpoint: Path | None = None, model: Path | None = None) -> int | None:
    """The holdout fold a checkpoint or an exported model was trained with (None: nothing to read)."""
    if checkpoint is not None:
        config = load_checkpoint(checkpoint)[3].get("training", {}).get("config", {})
    elif model is not None and model.is_file():
        config = read_model_file(model).extra.get("training", {}).get("config", {})
    else:
        return None
    return int(config.get("holdout_fold", -1))


def holdout_fold(requested: int | None, checkpoint: Path | None, model: Path | None = None) -> int:
    """The cross-validation fold to evaluate: the one the checkpoint and the model were trained with,
    unless asked. Any disagreement is an error: a model would be scored on files it trained on."""
    trained = {str(path): fold for path, fold in ((checkpoint, trained_holdout_fold(checkpoint=checkpoint)),
                                                  (model, trained_holdout_fold(model=model)))
               if fold is not None}
    folds = set(trained.values()) | ({requested} if requested is not None else set())
    if len(folds) > 1:
        used = ", ".join(f"{path} was trained with holdout fold {fold}" for path, fold in trained.items())
        asked = f"--holdout-fold {requested}; " if requested is not None else ""
        raise ValueError(f"{asked}{used}: a model would be evaluated on its own training files")
    return folds.pop() if folds else -1


def payload_observer_for(mode: str, robot: str, train: list[Trajectory]) -> bool | PayloadObserver:
    """The engine's payload observer for ``--payload-observer`` table / refit / off."""
    if mode == "off":
        return False
    if mode == "table":
        return True
    observer = PayloadObserver.for_robot(robot)
    return False if observer is None else observer.refitted(train)


def run(args: argparse.Namespace) -> dict[str, Any]:
    robot = args.robot
    fold = holdout_fold(args.holdout_fold, args.checkpoint, args.model) if args.split == "holdout" else -1
    train_paths, eval_paths = select_files(args.nad_dir, robot, args.split, fold)
    trajs = [load_trajectory(p, robot) for p in eval_paths]
    names = ["/".join(p.parts[-4:]) for p in eval_paths]
    train = [load_trajectory(p, robot) for p in train_paths]
    base = default_spec(robot)
    spec = fit_normalization(base, [base.frames(t) for t in train])
    per_traj: dict[str, list[dict[str, Any]]] = {}
    force_series: dict[str, list[np.ndarray]] = {}
    rollouts = None
    timing: dict[str, float] = {}
    if args.checkpoint is not None:
        start = time.perf_counter()
        per_traj["rollout"], rollouts = evaluate_rollouts(args.checkpoint, trajs, args.substeps, args.apply_force)
        force_series["rollout"] = [r["force"] for r in rollouts]
        timing["rollout_s"] = time.perf_counter() - start
    if args.model is not None:
        start = time.perf_counter()
        observer = payload_observer_for(args.payload_observer, robot, train)
        per_traj["deployment"], force_series["deployment"] = evaluate_deployment(args.model, trajs, observer)
        timing["deployment_s"] = time.perf_counter() - start
    if args.baselines:
        start = time.perf_counter()
        res, ser = evaluate_baselines(train, trajs, spec)
        per_traj.update(res)
        force_series.update(ser)
        timing["baselines_s"] = time.perf_counter() - start
    if not per_traj:
        raise ValueError("nothing to evaluate: give --checkpoint and/or --model, or --baselines")
    summary = {
        "robot": robot, "split": args.split, "holdout_fold": fold, "files": [str(p) for p in eval_paths],
        "baseline_training_files": [str(p) for p in train_paths],
        "payload_observer": args.payload_observer if args.model is not None else None,
        "protocol": {"prefixes": list(PREFIXES), "force_all": "MAE over all frames and 3 axes, -999 read as 0",
                     "force_z": "MAE over labelled frames, z axis", "gate_threshold": GATE_PROBABILITY,
                     "rollout_force_row": "step i vs label row i+1", "deployment_force_row": "row i vs label row i"},
        "methods": {name: mean_over(res) for name, res in per_traj.items()},
        "per_trajectory": {name: dict(zip(names, res)) for name, res in per_traj.items()},
        "timing_s": timing,
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(summary, indent=2))
    (out / "metrics.md").write_text(markdown_table(summary))
    plot_series = {k: v for k, v in force_series.items() if k in ("rollout", "deployment", "ridge")}
    summary["plots"] = [str(p) for p in plot(out, trajs, names, plot_series, rollouts, load_robot(robot).joint_names)]
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="na-eval",
        description="Evaluate a NeuralActuator model: the published rollout protocol (--checkpoint, torch), "
                    "deployment-mode force through the runtime engine (--model, ONNX), and the ridge / "
                    "ID-Linear / momentum-observer baselines, on held-out NAD trajectories. Writes "
                    "metrics.json, metrics.md and PNG plots to --out-dir.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--robot", default="so101")
    parser.add_argument("--nad-dir", type=Path, default=Path("../shared/nad"), help="NAD release or subset folder")
    parser.add_argument("--split", default="holdout", choices=("holdout", "validation", "test"),
                        help="holdout = one train file per task (as na-train holds out)")
    parser.add_argument("--holdout-fold", type=int,
                        help="which train file of each task is held out (-1 the last; default: as the "
                             "checkpoint / model was trained, else -1)")
    parser.add_argument("--checkpoint", type=Path, help="final.pt from na-train (rollout protocol)")
    parser.add_argument("--model", type=Path, help="exported ONNX model (deployment mode)")
    parser.add_argument("--payload-observer", choices=("table", "refit", "off"), default="table",
                        help="deployment mode: the robot table's payload observer (as the node runs it), one refitted "
                             "on this split's training files (cross-validation), or none (the network alone)")
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--substeps", type=int, help="simulator substeps (default: as trained, else 5)")
    parser.add_argument("--apply-force", action=argparse.BooleanOptionalAction, default=None,
                        help="apply the predicted force at the grasp site in the rollout (default: as trained)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=Path("eval/so101"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        summary = run(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"na-eval: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out_dir) / "metrics.md").read_text())
    print(f"na-eval: wrote {args.out_dir}/metrics.json, metrics.md, {', '.join(Path(p).name for p in summary['plots'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
