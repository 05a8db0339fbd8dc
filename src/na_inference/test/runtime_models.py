"""Test models for the runtime tests, built without torch: the runtime (engine, node) needs only numpy and
ONNX Runtime, and so do its tests.

``contract_model`` writes a small random network straight as an ONNX graph that follows architecture.md's
contract (physical-unit window in, normalization inside, the four outputs, metadata written by
``contract.build_metadata``), and keeps the same network in numpy, so a test can compare the engine's
streaming output with an independent offline computation. That the exported Transformer equals its torch
model in ONNX Runtime is proven once, in test_export.py. Tests never depend on the shipped model file.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from na_description.robot_table import load_robot
from na_inference.contract import INPUT_NAME, build_metadata
from na_inference.features import CLIP, FeatureSpec, default_spec, fit_normalization

REPO = Path(__file__).resolve().parents[3]
_TMP = Path(tempfile.mkdtemp(prefix="na_runtime_models_"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
HIDDEN = 32
OPSET = 17


def _spec(robot: str) -> FeatureSpec:
    spec = default_spec(robot)
    # Normalization statistics of plausible telemetry, so the random network sees inputs in range.
    rng = np.random.default_rng(7)
    frames = rng.normal(size=(256, spec.n_features)).astype(np.float32)
    return fit_normalization(spec, [frames])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class ContractModel:
    """A random one-hidden-layer network over the whole window, as an ONNX file and in numpy."""

    path: Path
    weights: dict[str, np.ndarray]

    def outputs(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        """The network on windows [B, history+1, F] in physical units, computed in float64 numpy."""
        w = self.weights
        x = np.clip((windows - w["mean"]) / w["std"], -CLIP, CLIP).reshape(len(windows), -1)
        hidden = np.tanh(x @ w["w_in"] + w["b_in"])
        head = {name: hidden @ w[f"w_{name}"] + w[f"b_{name}"] for name in ("torque", "force", "gate", "condition")}
        gate = _sigmoid(head["gate"])
        return {"torque": head["torque"], "force": gate * head["force"], "contact_probability": gate,
                "condition": _sigmoid(head["condition"])}


def _weights(spec: FeatureSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = spec.window_length * spec.n_features
    widths = {"torque": spec.n_joints, "force": 3, "gate": 1, "condition": spec.n_joints}
    weights = {"mean": spec.mean.astype(np.float32), "std": spec.std.astype(np.float32),
               "w_in": rng.normal(0, 1 / np.sqrt(inputs), (inputs, HIDDEN)),
               "b_in": rng.normal(0, 0.1, HIDDEN)}
    for name, width in widths.items():
        weights[f"w_{name}"] = rng.normal(0, 1.0, (HIDDEN, width))
        weights[f"b_{name}"] = rng.normal(0, 0.1, width)
    return {k: v.astype(np.float32) for k, v in weights.items()}


def _graph(spec: FeatureSpec, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    node = helper.make_node
    window, features = spec.window_length, spec.n_features
    initializers = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    initializers += [numpy_helper.from_array(np.array([-1, window * features], np.int64), "flat_shape"),
                     numpy_helper.from_array(np.array(-CLIP, np.float32), "clip_lo"),
                     numpy_helper.from_array(np.array(CLIP, np.float32), "clip_hi")]
    nodes = [node("Sub", [INPUT_NAME, "mean"], ["centred"]), node("Div", ["centred", "std"], ["scaled"]),
             node("Clip", ["scaled", "clip_lo", "clip_hi"], ["normalized"]),
             node("Reshape", ["normalized", "flat_shape"], ["flat"]),
             node("Gemm", ["flat", "w_in", "b_in"], ["pre"]), node("Tanh", ["pre"], ["hidden"])]
    for name in ("torque", "force", "gate", "condition"):
        nodes.append(node("Gemm", ["hidden", f"w_{name}", f"b_{name}"], [f"{name}_head"]))
    nodes += [node("Identity", ["torque_head"], ["torque"]),
              node("Sigmoid", ["gate_head"], ["contact_probability"]),
              node("Mul", ["contact_probability", "force_head"], ["force"]),
              node("Sigmoid", ["condition_head"], ["condition"])]
    widths = {"torque": spec.n_joints, "force": 3, "contact_probability": 1, "condition": spec.n_joints}
    graph = helper.make_graph(
        nodes, "contract_test_model",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", window, features])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", w]) for n, w in widths.items()],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime the project pins
    for key, value in build_metadata(spec, load_robot(spec.robot).force_frame,
                                     {"training_data": "random weights (test)"}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    return model


@cache
def contract_model(robot: str = "so101", seed: int = 0) -> ContractModel:
    """A contract-conforming random model for ``robot`` (cached per test process)."""
    spec = _spec(robot)
    weights = _weights(spec, seed)
    path = _TMP / f"{robot}_{seed}.onnx"
    onnx.save_model(_graph(spec, weights), str(path))
    return ContractModel(path, {k: v.astype(np.float64) for k, v in weights.items()})


def shipped_model(robot: str = "so101") -> Path | None:
    """The model file shipped in models/ for ``robot``, if there is one."""
    path = REPO / load_robot(robot).model_file
    return path if path.is_file() else None
