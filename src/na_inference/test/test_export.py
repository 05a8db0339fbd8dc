"""ONNX export: dynamo exporter, contract metadata, dynamic batch, ORT-vs-torch parity (<= 1e-4), na-export CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from na_description.robot_table import load_robot
from na_inference.contract import INPUT_NAME, OUTPUT_NAMES, metadata_from_session, validate_for_robot
from na_inference.export import ExportError, export_onnx, main
from na_inference.features import HistoryWindow, default_spec, fit_normalization
from na_inference.model import DeployableModel, ModelConfig, NeuralActuatorNet, save_checkpoint
from na_inference.nad import find_trajectories, load_trajectory


@pytest.fixture(scope="module")
def small_net() -> NeuralActuatorNet:
    torch.manual_seed(0)
    return NeuralActuatorNet(ModelConfig.preset("small", 42, 6)).eval()


def test_export_real_data_parity_and_contract(nad_dir: Path, tmp_path: Path, small_net: NeuralActuatorNet) -> None:
    trajs = [load_trajectory(p) for p in find_trajectories(nad_dir, "so101")[:3]]
    spec = default_spec("so101")
    spec = fit_normalization(spec, [spec.frames(t) for t in trajs])
    out = tmp_path / "models" / "so101.onnx"
    report = export_onnx(small_net, spec, out, {"metrics": {"force_mae_n": 0.5}, "training_data": "test"})
    assert out.is_file() and max(report.max_abs_diff.values()) <= 1e-4

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    meta = metadata_from_session(session)
    validate_for_robot(meta, load_robot("so101"))
    assert meta.force_frame == load_robot("so101").force_frame and meta.extra["metrics"] == {"force_mae_n": 0.5}
    assert np.array_equal(meta.feature_spec.mean, spec.mean) and meta.feature_spec.feature_names == spec.feature_names
    assert [o.name for o in session.get_outputs()] == list(OUTPUT_NAMES)
    assert session.get_inputs()[0].shape[1:] == [9, 42] and not isinstance(session.get_inputs()[0].shape[0], int)

    # Real telemetry, both feature paths: the runtime's HistoryWindow through ORT == batch windows through torch.
    traj = trajs[0]
    batch = spec.windows(spec.frames(traj))
    with torch.no_grad():
        expected = [t.numpy() for t in DeployableModel(small_net, spec).eval()(torch.from_numpy(batch))]
    onnx_batch = session.run(list(OUTPUT_NAMES), {INPUT_NAME: batch})  # dynamic batch: whole trajectory
    for e, g in zip(expected, onnx_batch):
        assert np.max(np.abs(e - g)) <= 1e-4
    window = HistoryWindow(meta.feature_spec)  # built from the file's metadata alone
    for i in range(0, 40):
        x = window.push(meta.feature_spec.frame({q: v[i] for q, v in traj.quantities.items()}))
        got = session.run(list(OUTPUT_NAMES), {INPUT_NAME: x[None]})
        for e, g in zip(expected, got):
            assert np.max(np.abs(e[i] - g[0])) <= 1e-4


def test_failed_parity_writes_nothing(tmp_path: Path, small_net: NeuralActuatorNet) -> None:
    out = tmp_path / "bad.onnx"
    with pytest.raises(ExportError, match="differs from torch"):
        export_onnx(small_net, default_spec("so101"), out, tolerance=-1.0)
    assert list(tmp_path.iterdir()) == []


def test_na_export_cli(tmp_path: Path, small_net: NeuralActuatorNet, capsys: pytest.CaptureFixture) -> None:
    spec = default_spec("so101")
    ckpt = tmp_path / "model.pt"
    save_checkpoint(ckpt, small_net, small_net.config, spec, {"metrics": {"val_force_mae_n": 0.2}, "step": 3})
    out = tmp_path / "so101.onnx"
    assert main(["--checkpoint", str(ckpt), "--out", str(out), "--metadata", 'training_data={"files": 12}',
                 "--bench", "50"]) == 0
    printed = capsys.readouterr().out
    assert "max abs diff" in printed and "ONNX Runtime p50" in printed
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert json.loads(props["metrics"]) == {"val_force_mae_n": 0.2}
    assert json.loads(props["training_data"]) == {"files": 12} and json.loads(props["robot"]) == "so101"
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "x.onnx"), "--robot", "omx"]) == 1
    assert "model is for robot so101" in capsys.readouterr().err
    assert main(["--checkpoint", str(tmp_path / "missing.pt"), "--out", str(out)]) == 1
    assert "checkpoint not found" in capsys.readouterr().err


def test_na_export_help() -> None:
    result = subprocess.run([sys.executable, "-m", "na_inference.export", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "--checkpoint" in result.stdout and "--out" in result.stdout
