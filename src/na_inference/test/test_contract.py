"""The ONNX model contract: metadata round trip and clear rejections (wrong robot, joint order, shapes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from na_description.robot_table import load_robot
from na_inference.contract import (
    ModelContractError,
    build_metadata,
    check_io,
    read_metadata,
    validate_for_robot,
)
from na_inference.features import default_spec


def so101_meta() -> dict[str, str]:
    spec = default_spec("so101")
    spec = type(spec)(spec.robot, spec.joint_names, spec.quantities, spec.history, spec.dt,
                      np.arange(42, dtype=np.float32), np.full(42, 0.5, dtype=np.float32))
    return build_metadata(spec, "base", {"metrics": {"force_mae_n": 0.1}, "training_data": "NAD so101"})


def test_round_trip_and_extra() -> None:
    meta = read_metadata(so101_meta())
    assert meta.robot == "so101" and meta.force_frame == "base" and meta.history == 8
    assert meta.feature_spec.n_features == 42 and meta.feature_spec.mean[5] == 5.0
    assert meta.extra["metrics"] == {"force_mae_n": 0.1} and meta.extra["training_data"] == "NAD so101"
    validate_for_robot(meta, load_robot("so101"))
    check_io(meta, ["telemetry"], ["batch", 9, 42], ["torque", "force", "contact_probability", "condition"],
             {"torque": ["batch", 6], "force": ["batch", 3]})


def test_wrong_robot_is_rejected() -> None:
    omx_spec = default_spec("omx")
    meta = read_metadata(build_metadata(omx_spec, "ft_sensor"))
    with pytest.raises(ModelContractError, match="model is for robot omx, this node drives so101"):
        validate_for_robot(meta, load_robot("so101"))


def test_joint_order_mismatch_is_rejected() -> None:
    props = so101_meta()
    joints = json.loads(props["joint_names"])
    joints[0], joints[1] = joints[1], joints[0]
    props["joint_names"] = json.dumps(joints)
    props["feature_names"] = json.dumps([f"{n.split('/')[0]}/{joints[i % 6]}"
                                         for i, n in enumerate(json.loads(props["feature_names"]))])
    meta = read_metadata(props)
    with pytest.raises(ModelContractError, match="joint order"):
        validate_for_robot(meta, load_robot("so101"))


def test_missing_and_malformed_entries() -> None:
    props = so101_meta()
    del props["feature_std"]
    with pytest.raises(ModelContractError, match="lacks feature_std"):
        read_metadata(props)
    props = so101_meta()
    props["feature_mean"] = json.dumps([0.0] * 41)
    with pytest.raises(ModelContractError, match="malformed"):
        read_metadata(props)
    props = so101_meta()
    props["history"] = "eight"
    with pytest.raises(ModelContractError, match="not JSON"):
        read_metadata(props)
    omx = build_metadata(default_spec("omx"), "ft_sensor")
    del omx["feature_definitions"]
    with pytest.raises(ModelContractError, match="without feature_definitions"):
        read_metadata(omx)


def test_shape_and_output_mismatches() -> None:
    meta = read_metadata(so101_meta())
    outputs = ["torque", "force", "contact_probability", "condition"]
    with pytest.raises(ModelContractError, match="36 features per step, metadata lists 42"):
        check_io(meta, ["telemetry"], ["batch", 9, 36], outputs)
    with pytest.raises(ModelContractError, match="history 8 needs 9"):
        check_io(meta, ["telemetry"], ["batch", 5, 42], outputs)
    with pytest.raises(ModelContractError, match="lacks outputs"):
        check_io(meta, ["telemetry"], ["batch", 9, 42], outputs[:2])
    with pytest.raises(ModelContractError, match="exactly"):
        check_io(meta, ["x"], ["batch", 9, 42], outputs)
    with pytest.raises(ModelContractError, match="width 5"):
        check_io(meta, ["telemetry"], ["batch", 9, 42], outputs, {"torque": ["batch", 5]})


def test_sample_period_mismatch() -> None:
    props = so101_meta()
    props["dt"] = json.dumps(0.1)
    with pytest.raises(ModelContractError, match="sample period"):
        validate_for_robot(read_metadata(props), load_robot("so101"))
