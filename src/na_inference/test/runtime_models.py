"""Test models for the runtime tests: networks with random weights exported through the project's own
exporter (na_inference.export), cached per test process. Tests never depend on the shipped model file."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
_TMP = Path(tempfile.mkdtemp(prefix="na_runtime_models_"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


def _spec(robot: str):
    from na_inference.features import default_spec, fit_normalization

    spec = default_spec(robot)
    # Normalization statistics of plausible telemetry, so the random network sees inputs in range.
    rng = np.random.default_rng(7)
    frames = rng.normal(size=(256, spec.n_features)).astype(np.float32)
    return fit_normalization(spec, [frames])


@cache
def exported_model(robot: str = "so101", preset: str = "small", seed: int = 0):
    """(ONNX path, torch DeployableModel in eval mode) of a random ``preset`` network for ``robot``."""
    import torch

    from na_inference.export import export_onnx
    from na_inference.model import DeployableModel, ModelConfig, NeuralActuatorNet

    spec = _spec(robot)
    torch.manual_seed(seed)
    net = NeuralActuatorNet(ModelConfig.preset(preset, spec.n_features, spec.n_joints)).eval()
    path = _TMP / f"{robot}_{preset}_{seed}.onnx"
    export_onnx(net, spec, path, {"training_data": "random weights (test)"})
    return path, DeployableModel(net, spec).eval()


def shipped_model(robot: str = "so101") -> Path | None:
    """The model file shipped in models/ for ``robot``, if there is one."""
    from na_description.robot_table import load_robot

    path = REPO / load_robot(robot).model_file
    return path if path.is_file() else None
