"""The ONNX model contract of architecture.md, checked without torch (the runtime node imports this).

Input ``telemetry`` float32 [batch, history+1, n_features] in physical units, oldest first;
outputs ``torque`` [batch, n_joints] N.m, ``force`` [batch, 3] N (gated), ``contact_probability``
[batch, 1], ``condition`` [batch, n_joints]. metadata_props carry JSON values: robot, joint_names,
feature_names, quantities, history, dt, force_frame, feature_mean, feature_std, feature_definitions,
plus free entries (training_data, metrics, ...). A consumer builds its input from these alone.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from na_description.robot_table import RobotTable

from .features import FeatureError, FeatureSpec

INPUT_NAME = "telemetry"
OUTPUT_NAMES = ("torque", "force", "contact_probability", "condition")
REQUIRED_KEYS = ("robot", "joint_names", "feature_names", "history", "dt", "force_frame", "feature_mean",
                 "feature_std")
SPEC_KEYS = (*REQUIRED_KEYS, "quantities", "feature_definitions")
CONTRACT_VERSION = 1
DT_TOLERANCE = 0.25  # relative: a model trained at another sample period sees differently spaced history


class ModelContractError(ValueError):
    """The model file does not follow the contract, or was made for another robot."""


@dataclass
class ModelMetadata:
    robot: str
    joint_names: tuple[str, ...]
    feature_spec: FeatureSpec
    force_frame: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def history(self) -> int:
        return self.feature_spec.history

    @property
    def input_shape(self) -> tuple[str, int, int]:
        return ("batch", self.feature_spec.window_length, self.feature_spec.n_features)


def build_metadata(spec: FeatureSpec, force_frame: str, extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """metadata_props entries (all JSON strings) for a model using ``spec``."""
    meta = spec.to_metadata()
    meta["force_frame"] = json.dumps(force_frame)
    meta["contract_version"] = json.dumps(CONTRACT_VERSION)
    for key, value in (extra or {}).items():
        if key in meta:
            raise ModelContractError(f"extra metadata key {key!r} would overwrite a contract entry")
        meta[key] = value if isinstance(value, str) and _is_json(value) else json.dumps(value)
    return meta


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def read_metadata(metadata_props: Mapping[str, str]) -> ModelMetadata:
    """Parse and check metadata_props; ModelContractError names the missing or malformed entry."""
    missing = [k for k in REQUIRED_KEYS if k not in metadata_props]
    if missing:
        raise ModelContractError(f"model metadata lacks {', '.join(missing)} (not a NeuralActuator model file?)")
    try:
        spec = FeatureSpec.from_metadata(metadata_props)
    except (FeatureError, ValueError, TypeError) as exc:
        raise ModelContractError(f"model metadata is malformed: {exc}") from None
    try:
        force_frame = json.loads(metadata_props["force_frame"])
    except json.JSONDecodeError:
        raise ModelContractError("model metadata 'force_frame' is not JSON") from None
    definitions: dict[str, str] = {}
    if "feature_definitions" in metadata_props:
        try:
            definitions = dict(json.loads(metadata_props["feature_definitions"]))
        except (json.JSONDecodeError, TypeError, ValueError):
            raise ModelContractError("model metadata 'feature_definitions' is not a JSON object") from None
    undefined = [q for q in spec.feature_definitions if q not in definitions]
    if undefined:
        raise ModelContractError(f"model uses non-standard quantities {undefined} without feature_definitions")
    extra: dict[str, Any] = {}
    for key, value in metadata_props.items():
        if key in SPEC_KEYS:
            continue
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value
    return ModelMetadata(robot=spec.robot, joint_names=spec.joint_names, feature_spec=spec,
                         force_frame=str(force_frame), extra=extra)


def validate_for_robot(meta: ModelMetadata, robot: RobotTable) -> None:
    """Raise ModelContractError unless the model was made for ``robot`` (name, joint order, sample period)."""
    if meta.robot != robot.name:
        raise ModelContractError(f"model is for robot {meta.robot}, this node drives {robot.name}")
    if tuple(meta.joint_names) != tuple(robot.joint_names):
        if sorted(meta.joint_names) == sorted(robot.joint_names):
            raise ModelContractError(
                f"model joint order {list(meta.joint_names)} differs from the robot's {list(robot.joint_names)}"
            )
        raise ModelContractError(f"model joints {list(meta.joint_names)} are not the robot's {list(robot.joint_names)}")
    dt = meta.feature_spec.dt
    if not math.isfinite(dt) or abs(dt - robot.data_dt) > DT_TOLERANCE * robot.data_dt:
        raise ModelContractError(
            f"model was trained at a sample period of {dt} s, {robot.name} runs at {robot.data_dt} s"
        )


def check_io(meta: ModelMetadata, input_names: Sequence[str], input_shape: Sequence[Any],
             output_names: Sequence[str], output_shapes: Mapping[str, Sequence[Any]] | None = None) -> None:
    """Check a model's declared inputs/outputs against its metadata (dynamic dims may be str or None)."""
    if list(input_names) != [INPUT_NAME]:
        raise ModelContractError(f"model inputs are {list(input_names)}, the contract needs exactly [{INPUT_NAME!r}]")
    missing = [n for n in OUTPUT_NAMES if n not in output_names]
    if missing:
        raise ModelContractError(f"model lacks outputs {missing} (has {list(output_names)})")
    spec = meta.feature_spec
    shape = list(input_shape)
    if len(shape) != 3:
        raise ModelContractError(f"input {INPUT_NAME!r} has rank {len(shape)}, expected [batch, history+1, features]")
    if isinstance(shape[2], int) and shape[2] != spec.n_features:
        raise ModelContractError(
            f"input has {shape[2]} features per step, metadata lists {spec.n_features} feature_names"
        )
    if isinstance(shape[1], int) and shape[1] != spec.window_length:
        raise ModelContractError(f"input has {shape[1]} steps, metadata history {spec.history} needs {spec.window_length}")
    expected_width = {"torque": spec.n_joints, "force": 3, "contact_probability": 1, "condition": spec.n_joints}
    for name, out_shape in (output_shapes or {}).items():
        width = list(out_shape)[-1] if len(out_shape) else None
        if name in expected_width and isinstance(width, int) and width != expected_width[name]:
            raise ModelContractError(f"output {name!r} has width {width}, expected {expected_width[name]}")


def metadata_from_session(session: Any) -> ModelMetadata:
    """Read and check the contract of an onnxruntime.InferenceSession (metadata + input/output signature)."""
    meta = read_metadata(session.get_modelmeta().custom_metadata_map)
    inputs = session.get_inputs()
    outputs = session.get_outputs()
    check_io(meta, [i.name for i in inputs], inputs[0].shape if inputs else [], [o.name for o in outputs],
             {o.name: o.shape for o in outputs})
    return meta


def read_model_file(path: str | os.PathLike) -> ModelMetadata:
    """The checked contract of an ONNX model file, for tools that need its metadata, not an engine."""
    import onnxruntime as ort

    return metadata_from_session(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]))
