"""The evaluation harness on a toy model: metrics by hand, batched protocol rollouts, deployment mode
through the runtime engine, and na-eval end to end on a small NAD folder written from real files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from na_inference.dynamics import RigidBodyDynamics
from na_inference.evaluate import deployment_forces, force_metrics, main, mean_over
from na_inference.export import export_onnx
from na_inference.features import default_spec, fit_normalization
from na_inference.model import DeployableModel, ModelConfig, NeuralActuatorNet, save_checkpoint
from na_inference.nad import Trajectory, find_trajectories, load_trajectory, write_trajectory
from na_inference.rollout import FeatureMixer, prepare, protocol_rollouts, rollout

ROWS = 40


def truncated(traj: Trajectory, rows: int) -> Trajectory:
    return replace(traj, time=traj.time[:rows], force=traj.force[:rows],
                   quantities={k: v[:rows] for k, v in traj.quantities.items()})


@pytest.fixture(scope="module")
def toy(tmp_path_factory, request):
    """A small NAD folder (2 tasks x 2 files x 40 rows, from real files), a random small model on it,
    its checkpoint and its ONNX export."""
    from na_testing import nad_root

    root = nad_root()
    if root is None:
        pytest.skip("NAD data not found: set NAD_DIR or place the NAD files in ../shared/nad")
    base = tmp_path_factory.mktemp("toy")
    nad = base / "nad"
    sources = [p for p in find_trajectories(root, "so101") if "300g" in p.parts]
    picked = [p for p in sources if p.name in ("001.csv", "002.csv")]
    for p in picked:
        traj = truncated(load_trajectory(p), ROWS)
        write_trajectory(nad / Path(*p.parts[-5:]), traj)
    trajs = [load_trajectory(p) for p in find_trajectories(nad, "so101")]
    spec0 = default_spec("so101")
    spec = fit_normalization(spec0, [spec0.frames(t) for t in trajs])
    torch.manual_seed(0)
    config = ModelConfig.preset("small", spec.n_features, spec.n_joints, history=spec.history)
    net = NeuralActuatorNet(config).eval()
    checkpoint = base / "toy.pt"
    save_checkpoint(checkpoint, net, config, spec, {})
    onnx_path = base / "toy.onnx"
    export_onnx(net, spec, onnx_path, {"training_data": "toy"})
    return {"nad": nad, "net": net, "spec": spec, "checkpoint": checkpoint, "onnx": onnx_path, "trajs": trajs}


def test_force_metrics_by_hand():
    force = np.full((4, 3), np.nan)
    force[2:, 2] = -3.0
    traj = Trajectory(robot="so101", path=None, task="t", payload_kg=0.3, time=np.arange(4) * 0.016,
                      quantities={}, force=force)
    pred = np.zeros((4, 3))
    pred[:, 2] = [0.0, -1.0, -2.0, -3.0]
    got = force_metrics(pred, traj, slice(0, None), gate=np.array([0.1, 0.6, 0.9, 0.9]))
    # |err| z: 0, 1, 1, 0 ; x, y 0 -> mean over 12 entries = 2/12
    assert got["force_mae_all"]["full"] == pytest.approx(2 / 12)
    assert got["force_z_mae_labelled"] == pytest.approx(0.5)
    assert got["force_abs_unlabelled"] == pytest.approx(1 / 6)
    assert got["gate_accuracy"] == pytest.approx(0.75)
    assert mean_over([got, got])["force_mae_all"]["full"] == pytest.approx(2 / 12)


def test_batched_protocol_rollouts_equal_single_ones(toy):
    spec, net = toy["spec"], toy["net"]
    dyn = RigidBodyDynamics.for_robot("so101", dtype=torch.float32)
    mixer = FeatureMixer(spec)
    short = prepare(truncated(toy["trajs"][0], 25), spec)
    long = prepare(toy["trajs"][1], spec)
    both = protocol_rollouts(net, dyn, mixer, [short, long], spec.dt)
    for prepared, batched in zip((short, long), both):
        alone = protocol_rollouts(net, dyn, mixer, [prepared], spec.dt)[0]
        assert batched.q.shape[1] == len(prepared) - 1
        torch.testing.assert_close(batched.q, alone.q, atol=1e-5, rtol=0)
        torch.testing.assert_close(batched.force, alone.force, atol=1e-5, rtol=0)
    # Protocol start: q0 = recorded row 0, qvel 0, mean-frame history.
    first = rollout(net, dyn, mixer, torch.from_numpy(long.frames[:1])[None],
                    mixer.mean.expand(1, spec.history, spec.n_features), torch.from_numpy(long.position[:1]),
                    torch.zeros(1, 6), spec.dt)
    torch.testing.assert_close(first.q[0, 0], both[1].q[0, 0])


def test_deployment_mode_equals_the_torch_model_on_training_windows(toy):
    """With regular stamps the runtime engine sees exactly the training windows: same force as torch."""
    spec = toy["spec"]
    traj = toy["trajs"][0]
    regular = replace(traj, time=np.arange(len(traj)) * spec.dt)
    force, gate = deployment_forces(toy["onnx"], regular, payload_observer=False)  # the network alone
    with torch.no_grad():
        _, expected, prob, _ = DeployableModel(toy["net"], spec)(torch.from_numpy(spec.windows(spec.frames(traj))))
    np.testing.assert_allclose(force, expected.numpy(), atol=1e-4)
    np.testing.assert_allclose(gate, prob.numpy()[:, 0], atol=1e-4)


def test_na_eval_end_to_end(toy, tmp_path):
    out = tmp_path / "eval"
    code = main(["--nad-dir", str(toy["nad"]), "--checkpoint", str(toy["checkpoint"]), "--model", str(toy["onnx"]),
                 "--out-dir", str(out)])
    assert code == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert set(summary["methods"]) == {"rollout", "deployment", "ridge", "id_linear", "momentum_observer"}
    assert len(summary["files"]) == 2  # one held out per task
    assert summary["payload_observer"] == "table"  # deployment as the node runs it
    rollout_metrics = summary["methods"]["rollout"]
    assert rollout_metrics["worst_joint_mae_deg"]["full"] >= rollout_metrics["mean_joint_mae_deg"]["full"]
    assert "| ridge |" in (out / "metrics.md").read_text()
    for png in ("force_vs_label.png", "rollout_joints.png"):
        assert (out / png).stat().st_size > 1000


def test_na_eval_reports_missing_inputs(tmp_path):
    assert main(["--nad-dir", str(tmp_path), "--out-dir", str(tmp_path / "o")]) == 2


def test_na_eval_holds_out_the_checkpoints_cross_validation_fold(toy, tmp_path, capsys):
    """A checkpoint trained with --holdout-fold 0 is scored on the first file of each task, and asking
    for another fold is refused (it would score the model on its own training files)."""
    checkpoint = tmp_path / "fold0.pt"
    save_checkpoint(checkpoint, toy["net"], toy["net"].config, toy["spec"],
                    {"training": {"config": {"holdout_fold": 0}}})
    out = tmp_path / "eval"
    assert main(["--nad-dir", str(toy["nad"]), "--checkpoint", str(checkpoint), "--no-baselines",
                 "--out-dir", str(out)]) == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["holdout_fold"] == 0
    assert [Path(f).name for f in summary["files"]] == ["001.csv", "001.csv"]
    assert main(["--nad-dir", str(toy["nad"]), "--checkpoint", str(checkpoint), "--holdout-fold", "1",
                 "--out-dir", str(tmp_path / "refused")]) == 2
    assert "trained with holdout fold 0" in capsys.readouterr().err
    # An exported model carries its fold in the metadata: alone it picks the fold, and a model and a
    # checkpoint of different folds are refused.
    fold0_onnx = tmp_path / "fold0.onnx"
    export_onnx(toy["net"], toy["spec"], fold0_onnx, {"training": {"config": {"holdout_fold": 0}}})
    assert main(["--nad-dir", str(toy["nad"]), "--model", str(fold0_onnx), "--no-baselines",
                 "--out-dir", str(tmp_path / "model_only")]) == 0
    assert json.loads((tmp_path / "model_only" / "metrics.json").read_text())["holdout_fold"] == 0
    assert main(["--nad-dir", str(toy["nad"]), "--checkpoint", str(toy["checkpoint"]), "--model", str(fold0_onnx),
                 "--out-dir", str(tmp_path / "mixed")]) == 2
    assert "fold0.onnx was trained with holdout fold 0" in capsys.readouterr().err
