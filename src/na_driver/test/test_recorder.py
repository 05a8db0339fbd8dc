"""na-record round trip: a publisher process -> na-record process -> NAD CSV -> na_inference.nad loader."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from actuator_publisher import sample_values

from na_description.robot_table import load_robot
from na_driver.recorder import NadRecording, payload_force
from na_inference.nad import load_trajectory

HERE = Path(__file__).parent


def record(processes, tmp_path, robot: str, extra: list[str]) -> Path:
    out = tmp_path / f"{robot}_rec.csv"
    publisher = processes.python([str(HERE / "actuator_publisher.py"), robot, "60"])
    recorder = processes.python(["-m", "na_driver.recorder", "--robot", robot, "--output", str(out),
                                 "--max-samples", "40", *extra])
    try:
        output, _ = recorder.communicate(timeout=60)
    finally:
        processes.stop(publisher)
    assert recorder.returncode == 0, output
    assert "wrote 40 samples" in output
    return out


def check_rows(traj, robot_name: str) -> np.ndarray:
    """Every recorded row equals the published sample it came from, within register rounding."""
    robot = load_robot(robot_name)
    n = robot.n_joints
    ks = np.rint(traj.quantities["position"][:, 0] / 1e-3).astype(int)
    assert len(set(ks.tolist())) == len(ks) and np.all(np.diff(ks) > 0)
    two_pi_per_count = 2 * math.pi / 4096
    tolerance = {  # half a register count of the robot's NAD file unit
        "so101": {"velocity": two_pi_per_count / 2, "load": 5e-4, "current": 0.0065 / 2,
                  "voltage": 0.05, "temperature": 0.5},
        "omx": {"velocity": 0.229 * 2 * math.pi / 60 / 2, "load": 0.5 / 885, "current": 0.00269 / 2,
                "voltage": 0.05, "temperature": 0.5},
    }[robot_name]
    for row, k in enumerate(ks):
        expected = sample_values(int(k), n)
        np.testing.assert_allclose(traj.quantities["position"][row], expected["position"], atol=1e-12)
        np.testing.assert_allclose(traj.quantities["goal_position"][row], expected["goal_position"], atol=1e-12)
        for q, tol in tolerance.items():
            np.testing.assert_allclose(traj.quantities[q][row], expected[q], atol=tol + 1e-9, err_msg=q)
    stamps_ok = np.all(np.diff(traj.time) > 0) and traj.time[0] == 0.0
    assert stamps_ok
    return ks


@pytest.mark.ros
def test_so101_round_trip_with_payload_labels(processes, tmp_path):
    bag = tmp_path / "so101.mcap"
    path = record(processes, tmp_path, "so101", ["--payload-kg", "0.3", "--holding", "--mcap", str(bag)])
    raw = path.read_bytes()
    assert raw.count(b"\r\n") == 41 and raw.startswith(b"timestamp,pos1,")
    traj = load_trajectory(path, "so101")
    check_rows(traj, "so101")
    assert np.isnan(traj.force[:, :2]).all()                     # -999 in the file
    np.testing.assert_allclose(traj.force[:, 2], -0.3 * 9.81, atol=0.005)   # NAD writes SO-101 labels to 0.01 N
    assert b",-999," in raw
    from mcap_ros2.reader import read_ros2_messages

    bagged = [m.ros_msg for m in read_ros2_messages(str(bag))]
    assert len(bagged) == 40
    np.testing.assert_allclose([m.position[0] for m in bagged], traj.quantities["position"][:, 0])


@pytest.mark.ros
def test_omx_round_trip_with_ft_sensor(processes, tmp_path):
    path = record(processes, tmp_path, "omx", ["--force-topic", "/ft_sensor"])
    traj = load_trajectory(path, "omx")
    ks = check_rows(traj, "omx")
    labelled = ~np.isnan(traj.force).any(axis=1)
    assert labelled.mean() > 0.8
    exact = 0
    for row in np.flatnonzero(labelled):
        # the F/T reading nearest in stamp: the same sample's unless its reading was lost (best effort)
        lags = [d for d in range(-10, 11) if np.allclose(traj.force[row], sample_values(int(ks[row]) + d, 5)["force"],
                                                         atol=1e-9)]
        assert lags, f"row {row}: force {traj.force[row]} is no published reading near sample {ks[row]}"
        exact += lags[0] == 0 if len(lags) == 1 else 0 in lags
    assert exact >= 0.9 * labelled.sum()
    robot = load_robot("omx")
    np.testing.assert_allclose(traj.quantities["aperture"],
                               np.polyval(robot.raw["data"]["aperture_mm_poly"], traj.quantities["position"][:, 4]))


def test_recording_rejects_bad_samples_and_robots():
    robot = load_robot("so101")
    rec = NadRecording(robot, payload_kg=0.5)
    good = {q: [0.0] * 6 for q in ("position", "goal_position", "velocity", "load", "current", "voltage",
                                   "temperature")}
    assert rec.add(0.0, robot.joint_names, good, payload_force(0.5, True))
    bad = dict(good, load=[math.nan] * 6)
    assert not rec.add(0.1, robot.joint_names, bad, None)
    assert "load is not finite" in rec.skipped[-1]
    assert not rec.add(0.2, ["a"] * 6, good, None)
    assert len(rec) == 1
    assert payload_force(0.5, False) is None
    with pytest.raises(ValueError, match="servo-arm NAD schemas"):
        NadRecording(load_robot("panda"))
    assert sys.executable
