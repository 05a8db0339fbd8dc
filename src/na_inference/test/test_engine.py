"""The ONNX Runtime engine against an offline computation of the same network, its rate handling and its
bad-input behaviour. numpy and ONNX Runtime only, like the runtime itself (ORT == torch: test_export.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from runtime_models import contract_model, shipped_model

from na_description.robot_table import load_robot
from na_inference.contract import ModelContractError
from na_inference.engine import (
    GRID_TOLERANCE,
    InferenceEngine,
    JointMismatchError,
    ModelFileError,
    SampleStatus,
    derived_telemetry,
    resolve_model_path,
    select_joints,
)
from na_inference.nad import find_trajectories, load_trajectory

TOLERANCE = 1e-4


def _rows(traj, quantities):
    """Per-row samples (quantity -> [n_joints]) of a trajectory."""
    return [{q: traj.quantities[q][i] for q in quantities} for i in range(len(traj.time))]


def _assert_output_matches(out, expected: dict[str, np.ndarray], row: int) -> None:
    np.testing.assert_allclose(out.torque, expected["torque"][row], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(out.force, expected["force"][row], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(out.contact_probability, expected["contact_probability"][row, 0], atol=TOLERANCE)
    np.testing.assert_allclose(out.condition, expected["condition"][row], atol=TOLERANCE, rtol=0)


@pytest.fixture(scope="module")
def so101_model():
    return contract_model("so101")


@pytest.fixture
def nad_trajectory(nad_dir):
    paths = find_trajectories(nad_dir, "so101")
    assert paths, f"no SO-101 trajectories under {nad_dir}"
    return load_trajectory(paths[0])


def test_engine_streaming_equals_the_network_on_offline_windows(so101_model, nad_trajectory):
    """Sample by sample on the model grid, the engine gives what the network gives on the trajectory's windows
    built offline by the shared feature pipeline (start-up padding included)."""
    engine = InferenceEngine(so101_model.path, "so101", payload_observer=False)  # the network alone
    spec = engine.spec
    expected = so101_model.outputs(spec.windows(spec.frames(nad_trajectory)))
    outputs = []
    for i, sample in enumerate(_rows(nad_trajectory, engine.quantities)):
        result = engine.step(100.0 + i * spec.dt, sample)
        assert result.status is SampleStatus.INFERRED, result
        outputs.append(result.output)
    assert len(outputs) == len(nad_trajectory.time) > 500
    for i, out in enumerate(outputs):
        _assert_output_matches(out, expected, i)
        assert out.stamp == pytest.approx(100.0 + i * spec.dt)
        assert out.warming_up == (i < spec.history), i
    # not a constant network: the comparison above would be weak otherwise
    assert np.ptp(expected["torque"], axis=0).min() > 1e-3


def test_engine_resamples_recorded_nad_stamps_onto_the_model_grid(so101_model, nad_trajectory):
    """NAD stamps jitter (13-19 ms for a 16.05 ms model step): the engine interpolates onto the grid."""
    engine = InferenceEngine(so101_model.path, "so101", payload_observer=False)
    spec = engine.spec
    stamps = nad_trajectory.time
    frames = spec.frames(nad_trajectory).astype(np.float64)
    grid = np.arange(stamps[0], stamps[-1] + 1e-9, spec.dt)
    resampled = np.stack([np.interp(grid, stamps, frames[:, f]) for f in range(spec.n_features)], axis=1)
    expected = so101_model.outputs(spec.windows(resampled.astype(np.float32)))
    compared = 0
    for stamp, sample in zip(stamps, _rows(nad_trajectory, engine.quantities)):
        result = engine.step(float(stamp), sample)
        if result.output is None:
            assert result.status is SampleStatus.DECIMATED
            continue
        last_grid_row = int(np.floor((stamp - stamps[0]) / spec.dt + GRID_TOLERANCE))
        _assert_output_matches(result.output, expected, last_grid_row)
        assert result.output.stamp == stamp
        compared += 1
    assert compared > 0.9 * len(grid)
    assert engine.counters.decimated > 0 and engine.counters.resampled_steps > 0  # both cases occurred


def test_fast_telemetry_is_decimated_onto_the_grid_by_interpolation(so101_model):
    """1 kHz telemetry of a linear ramp: one inference per model step, history frames exactly on the grid."""
    path = so101_model.path
    engine = InferenceEngine(path, "so101")
    spec = engine.spec
    t0, rate, seconds = 5.0, 1000.0, 1.0
    slope = np.linspace(0.1, 0.6, spec.n_joints)

    def ramp(t):
        return {q: (t - t0) * slope for q in engine.quantities}

    stamps = t0 + np.arange(int(seconds * rate)) / rate
    inferred = [engine.step(float(t), ramp(t)) for t in stamps]
    n_out = sum(r.status is SampleStatus.INFERRED for r in inferred)
    assert n_out == int(np.floor((stamps[-1] - t0) / spec.dt)) + 1  # one per grid step, not per sample
    window = engine.model.input[0]
    last_grid = t0 + (n_out - 1) * spec.dt
    grid_times = last_grid - spec.dt * np.arange(spec.history, -1, -1)
    expected = np.stack([spec.frame(ramp(t)) for t in grid_times])
    np.testing.assert_allclose(window, expected, atol=1e-6)


def test_bad_samples_are_dropped_or_reset_without_crashing(so101_model):
    path = so101_model.path
    engine = InferenceEngine(path, "so101", max_gap_dt=5.0)
    dt = engine.dt
    good = {q: np.full(engine.spec.n_joints, 0.1) for q in engine.quantities}
    assert engine.step(10.0, good).reset_reason == "start"
    assert engine.step(10.0 + dt, good).status is SampleStatus.INFERRED

    nan = dict(good, load=np.array([0.1, np.nan, 0.1, 0.1, np.inf, 0.1]))
    result = engine.step(10.0 + 2 * dt, nan)
    assert result.status is SampleStatus.NON_FINITE and "shoulder_lift" in result.detail and "wrist_roll" in result.detail

    text = dict(good, voltage=["12.1"] * 5 + ["twelve"])
    assert engine.step(10.0 + 2 * dt, text).status is SampleStatus.NON_FINITE
    short = dict(good, velocity=np.zeros(4))
    assert engine.step(10.0 + 2 * dt, short).status is SampleStatus.MISSING_JOINTS
    missing = {q: v for q, v in good.items() if q != "temperature"}
    result = engine.step(10.0 + 2 * dt, missing)
    assert result.status is SampleStatus.MISSING_JOINTS and "temperature" in result.detail

    assert engine.step(10.0 + 2 * dt, good).status is SampleStatus.INFERRED
    result = engine.step(10.0 + 1.5 * dt, good)  # older than the last accepted stamp
    assert result.status is SampleStatus.OUT_OF_ORDER and "older" in result.detail
    assert engine.step(10.0 + 2 * dt, good).status is SampleStatus.OUT_OF_ORDER  # repeated stamp

    result = engine.step(10.0 + 20 * dt, good)  # gap of 18 steps > 5
    assert result.reset_reason and result.reset_reason.startswith("gap")
    assert result.output is not None and result.output.warming_up
    result = engine.step(1.0, good)  # clock restarted (e.g. a replayed bag): a new stream
    assert result.reset_reason and "jumped back" in result.reset_reason
    counters = engine.counters
    assert (counters.non_finite, counters.missing_joints, counters.out_of_order, counters.resets) == (2, 2, 2, 3)


def test_model_for_another_robot_is_rejected_with_a_clear_message():
    omx_path = contract_model("omx").path
    with pytest.raises(ModelContractError, match="model is for robot omx, this node drives so101"):
        InferenceEngine(omx_path, "so101")
    assert InferenceEngine(omx_path, "omx").spec.robot == "omx"


def test_missing_and_corrupt_model_files_fail_at_start(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        InferenceEngine(tmp_path / "nope.onnx", "so101")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07 this is not a protobuf" * 10)
    with pytest.raises(ModelFileError, match="not a loadable ONNX model"):
        InferenceEngine(corrupt, "so101")


def test_model_without_contract_metadata_is_rejected(tmp_path, so101_model):
    import onnx

    model = onnx.load(str(so101_model.path))
    del model.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(model, str(bare))
    with pytest.raises(ModelContractError, match="lacks"):
        InferenceEngine(bare, "so101")


def test_select_joints_reorders_by_name_and_names_missing_joints():
    joints = load_robot("so101").joint_names
    names = list(reversed(joints))
    arrays = {"position": np.arange(6.0)}
    sample = select_joints(names, arrays, joints, ["position"])
    np.testing.assert_array_equal(sample["position"], np.arange(6.0)[::-1])
    with pytest.raises(JointMismatchError, match="gripper"):
        select_joints([n for n in names if n != "gripper"], {"position": np.zeros(5)}, joints, ["position"])


def test_default_model_path_is_the_robot_tables_file_in_the_checkout():
    robot = load_robot("so101")
    path = resolve_model_path(robot)
    assert path.as_posix().endswith(robot.model_file)
    assert resolve_model_path(robot, "/x/y.onnx") == Path("/x/y.onnx")


def test_runtime_modules_and_their_tests_do_not_import_torch():
    """The node's modules, and these runtime tests' model fixtures, work in an install without torch."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "import na_inference.engine, na_inference.node, na_inference.monitor, na_inference.kinematics;"
            "import runtime_models; m = runtime_models.contract_model('so101');"
            "na_inference.engine.InferenceEngine(m.path, 'so101');"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; print(bad); assert not bad")
    result = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_omx_aperture_is_derived_from_the_gripper_angle_as_recorded(nad_dir):
    """ActuatorState has no gripper aperture: it is computed from the gripper angle with the robot table."""
    robot = load_robot("omx")
    traj = load_trajectory(find_trajectories(nad_dir, "omx", split=None)[0])
    derived = np.array([derived_telemetry(robot, {"position": q}, ["aperture"])["aperture"][0]
                        for q in traj.quantities["position"]])
    np.testing.assert_allclose(derived, traj.quantities["aperture"].reshape(-1), atol=0.01)  # mm
    engine = InferenceEngine(contract_model("omx").path, robot)
    assert "aperture" in engine.quantities
    outputs = 0
    for i, t in enumerate(traj.time):
        sample = {q: traj.quantities[q][i] for q in engine.quantities if q != "aperture"}
        sample.update(derived_telemetry(robot, sample, ["aperture"]))
        outputs += engine.step(float(t), sample).output is not None
    assert outputs > 0.9 * len(traj.time)


def test_shipped_so101_model_runs_on_nad(nad_dir):
    path = shipped_model("so101")
    if path is None:
        pytest.skip("no shipped models/so101.onnx yet")
    engine = InferenceEngine(path, "so101")
    traj = load_trajectory(find_trajectories(nad_dir, "so101")[0])
    outputs = [engine.step(float(t), s).output for t, s in zip(traj.time, _rows(traj, engine.quantities))]
    outputs = [o for o in outputs if o is not None]
    assert len(outputs) > 0.9 * len(traj.time)
    for out in outputs:
        assert np.isfinite(out.torque).all() and np.isfinite(out.force).all()
        assert 0.0 <= out.contact_probability <= 1.0
