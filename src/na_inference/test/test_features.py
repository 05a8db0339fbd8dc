"""The one feature pipeline: batch path (training/eval) and HistoryWindow path (runtime) must agree bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from na_inference.features import (
    FeatureError,
    FeatureSpec,
    HistoryWindow,
    default_spec,
    fit_normalization,
    next_row_targets,
    std_floors,
)
from na_inference.nad import find_trajectories, load_trajectory


def so101_spec(nad_dir: Path) -> tuple[FeatureSpec, list]:
    trajs = [load_trajectory(p) for p in find_trajectories(nad_dir, "so101")[:4]]
    spec = default_spec("so101")
    return fit_normalization(spec, [spec.frames(t) for t in trajs]), trajs


def test_default_specs_follow_the_method() -> None:
    so101 = default_spec("so101")
    assert so101.n_features == 42 and so101.history == 8 and so101.window_length == 9
    assert so101.feature_names[:2] == ("goal_position/shoulder_pan", "goal_position/shoulder_lift")
    assert so101.feature_names[-1] == "position_error/gripper"
    assert [n.split("/")[0] for n in so101.feature_names[::6]] == [
        "goal_position", "position", "load", "velocity", "voltage", "temperature", "position_error"]
    assert so101.dt == 0.01605
    omx = default_spec("omx")
    assert omx.n_features == 36 and "aperture/gripper" in omx.feature_names
    assert omx.feature_definitions == {"aperture": omx.feature_definitions["aperture"]}
    assert "mm" in omx.feature_definitions["aperture"]


def test_std_floors_are_the_reference_floors_in_physical_units() -> None:
    floors = std_floors("so101", default_spec("so101").quantities, default_spec("so101").joint_names)
    by_group = floors.reshape(7, 6)[:, 0]
    expected = [0.05, 0.05, 1 / 1000, 2 * math.pi / 4096, 0.1, 1.0, 0.05]
    np.testing.assert_allclose(by_group, expected, rtol=1e-6)


def test_frames_and_history_window_are_bit_identical(nad_dir: Path) -> None:
    spec, trajs = so101_spec(nad_dir)
    for traj in trajs[:2]:
        batch = spec.windows(spec.frames(traj))
        assert batch.shape == (len(traj), 9, 42) and batch.dtype == np.float32
        window = HistoryWindow(spec)
        for i in range(len(traj)):
            sample = {q: v[i] for q, v in traj.quantities.items()}
            online = window.push(spec.frame(sample))
            assert np.array_equal(online, batch[i]), f"row {i} differs"
        window.reset()
        assert window.filled == 0
        first = window.push(spec.frame({q: v[0] for q, v in traj.quantities.items()}))
        assert np.array_equal(first, batch[0])


def test_padding_is_zero_after_normalization(nad_dir: Path) -> None:
    spec, trajs = so101_spec(nad_dir)
    frames = spec.frames(trajs[0])
    x = spec.normalize(spec.windows(frames))
    assert np.all(x[0, :8] == 0.0) and np.all(x[3, :5] == 0.0)
    assert not np.all(x[0, 8] == 0.0)
    np.testing.assert_array_equal(spec.windows(frames)[20, -1], frames[20])
    np.testing.assert_array_equal(spec.windows(frames)[20, 0], frames[12])
    # position_error is goal - position, in rad; velocity is rad/s (never encoder steps/s).
    pe = frames[:, spec.feature_names.index("position_error/elbow_flex")]
    goal = trajs[0].quantities["goal_position"][:, 2]
    pos = trajs[0].quantities["position"][:, 2]
    np.testing.assert_array_equal(pe, (goal - pos).astype(np.float32))
    assert np.abs(frames[:, spec.feature_names.index("velocity/shoulder_lift")]).max() < 20


def test_normalization_statistics_and_clip(nad_dir: Path) -> None:
    spec, trajs = so101_spec(nad_dir)
    stacked = np.concatenate([spec.frames(t) for t in trajs])
    np.testing.assert_allclose(spec.mean, stacked.mean(axis=0), rtol=1e-4, atol=1e-6)
    assert np.all(spec.std >= std_floors("so101", spec.quantities, spec.joint_names))
    z = spec.normalize(stacked)
    assert np.abs(z).max() <= 10.0
    far = spec.normalize(spec.mean + 100 * spec.std)
    assert np.all(far == 10.0)


def test_metadata_round_trip(nad_dir: Path) -> None:
    spec, _ = so101_spec(nad_dir)
    back = FeatureSpec.from_metadata(spec.to_metadata())
    assert back.feature_names == spec.feature_names and back.history == spec.history and back.dt == spec.dt
    assert np.array_equal(back.mean, spec.mean) and np.array_equal(back.std, spec.std)


def test_bad_samples_are_rejected() -> None:
    spec = default_spec("so101")
    sample = {q: np.zeros(6) for q in ("goal_position", "position", "load", "velocity", "voltage", "temperature")}
    assert spec.frame(sample).shape == (42,)
    with pytest.raises(FeatureError, match="lacks 'voltage'"):
        spec.frame({k: v for k, v in sample.items() if k != "voltage"})
    with pytest.raises(FeatureError, match="'load' has shape"):
        spec.frame({**sample, "load": np.zeros(5)})
    with pytest.raises(FeatureError, match="frame must have shape"):
        HistoryWindow(spec).push(np.zeros(41))
    with pytest.raises(FeatureError, match="mean/std"):
        FeatureSpec("so101", spec.joint_names, spec.quantities, 8, 0.016, np.zeros(3), np.ones(3))
    with pytest.raises(FeatureError, match="> 0"):
        FeatureSpec("so101", spec.joint_names, spec.quantities, 8, 0.016, np.zeros(42), np.zeros(42))


def test_next_row_targets() -> None:
    idx, target = next_row_targets(np.arange(5.0))
    np.testing.assert_array_equal(idx, [0, 1, 2, 3])
    np.testing.assert_array_equal(target, [1, 2, 3, 4])


def test_feature_cli_prints_table_and_timing(nad_dir: Path, capsys: pytest.CaptureFixture) -> None:
    from na_inference.features import main

    assert main([str(nad_dir), "--robot", "omx"]) == 0
    out = capsys.readouterr().out
    assert "omx: 36 features x 9 tokens" in out and "aperture/gripper" in out and "us/sample" in out


def test_quantity_slices_cover_the_frame(nad_dir: Path) -> None:
    spec, trajs = so101_spec(nad_dir)
    frames = spec.frames(trajs[0])
    velocity = frames[:, spec.quantity_slice("velocity")]
    np.testing.assert_array_equal(velocity, trajs[0].quantities["velocity"].astype(np.float32))
    assert spec.quantity_slice("position_error") == slice(36, 42)
    with pytest.raises(FeatureError, match="no quantity 'current'"):
        spec.quantity_slice("current")
