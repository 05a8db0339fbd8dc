"""The bus layer through the real SDKs against na_sim's emulated Feetech/Dynamixel buses (no mocks)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from na_description.robot_table import load_robot
from na_driver.bus import BusDisconnectedError, BusReadError, make_bus
from na_driver.calibration import (
    Calibration,
    CalibrationError,
    JointCalibration,
    load_lerobot_calibration,
    write_lerobot_calibration,
)
from na_sim.bus import FaultSpec, StaticBackend, make_emulator

ROBOTS = ("so101", "omx")
RAD_PER_COUNT = 2 * math.pi / 4096


def set_distinct_state(backend: StaticBackend, n: int, base: float = 0.0) -> None:
    """Signed, joint-specific values so sign and ordering mistakes show."""
    for j in range(n):
        backend.set_state(j, position=base + 0.3 * j - 0.7, velocity=0.25 * j - 0.6, load=0.07 * j - 0.2,
                          current=0.15 * j - 0.3, voltage=11.5 + 0.1 * j, temperature=30.0 + j)


def assert_matches(sample, states, robot_name: str) -> None:
    expected = {f: np.array([getattr(s, f) for s in states]) for f in
                ("position", "velocity", "load", "current", "voltage", "temperature")}
    vel_tol = 1.5 * RAD_PER_COUNT if robot_name == "so101" else 0.0241   # one velocity count
    np.testing.assert_allclose(sample.position, expected["position"], atol=1.5 * RAD_PER_COUNT)
    np.testing.assert_allclose(sample.velocity, expected["velocity"], atol=vel_tol)
    np.testing.assert_allclose(sample.load, expected["load"], atol=2e-3)
    np.testing.assert_allclose(sample.current, expected["current"], atol=0.0066 if robot_name == "so101" else 0.0027)
    np.testing.assert_allclose(sample.voltage, expected["voltage"], atol=0.051)
    np.testing.assert_allclose(sample.temperature, expected["temperature"], atol=0.51)


@pytest.fixture(params=ROBOTS)
def rig(request, tmp_path):
    robot = load_robot(request.param)
    backend = StaticBackend(robot.n_joints)
    set_distinct_state(backend, robot.n_joints)
    emulator = make_emulator(robot, backend, link=str(tmp_path / "ttyBUS"))
    emulator.start()
    bus = make_bus(robot, emulator.path)
    yield robot, backend, emulator, bus
    bus.close()
    emulator.stop()


def test_decode_equals_backend_state(rig):
    robot, backend, _, bus = rig
    bus.connect()
    assert not bus.echo_detected
    sample = bus.read()
    assert_matches(sample, backend.servo_states(), robot.name)
    assert sample.hardware_error.tolist() == [0] * robot.n_joints
    assert abs(sample.stamp_ns - time.time_ns()) < 1e9


def test_goals_and_torque_reach_backend(rig):
    robot, backend, _, bus = rig
    bus.connect()
    goals = [0.4 - 0.2 * j for j in range(robot.n_joints)]
    bus.write_goals(goals)
    bus.read()   # a round trip after the broadcast write: the emulator has applied it
    np.testing.assert_allclose(backend.goals, goals, atol=RAD_PER_COUNT)
    bus.set_torque(True)
    assert backend.torque_enabled == [True] * robot.n_joints
    bus.set_torque(False)
    assert backend.torque_enabled == [False] * robot.n_joints
    with pytest.raises(ValueError, match="not finite"):
        bus.write_goals([math.nan] * robot.n_joints)


def test_hardware_error_bits_are_reported(rig):
    robot, backend, _, bus = rig
    backend.set_state(1, hardware_error=0x04 if robot.name == "omx" else 0x20)
    bus.connect()
    sample = bus.read()
    assert sample.hardware_error[1] != 0
    assert sample.hardware_error[0] == 0


@pytest.mark.parametrize("spec", ["drop=0.03", "corrupt=0.03", "late=0.02,late_ms=60", "echo=1,drop=0.03"])
def test_faults_never_return_stale_samples(rig, spec):
    """Each cycle the backend gets a new unique state; every returned sample must be that state."""
    robot, backend, emulator, bus = rig
    emulator.set_faults(FaultSpec.parse(spec + ",seed=7"))
    bus.connect()
    ok = failed = 0
    for cycle in range(150):
        set_distinct_state(backend, robot.n_joints, base=(cycle % 40) * 0.02 - 0.4)
        try:
            sample = bus.read()
        except BusReadError:
            failed += 1
            continue
        ok += 1
        assert_matches(sample, backend.servo_states(), robot.name)
    assert failed > 0, "the injected faults should have failed some reads"
    assert bus.stats.reads_failed == failed
    assert sum(bus.stats.servo_errors.values()) >= 1
    assert ok > 75, f"only {ok} of 150 cycles succeeded with {spec}"
    if "echo" in spec:
        assert bus.echo_detected
    emulator.set_faults(FaultSpec(echo=True) if "echo" in spec else None)   # the adapter still echoes
    set_distinct_state(backend, robot.n_joints, base=0.5)
    for _ in range(5):   # recovery: a clean bus gives fresh samples every cycle again
        assert_matches(bus.read(), backend.servo_states(), robot.name)


def test_unplug_and_replug(rig):
    robot, backend, emulator, bus = rig
    bus.connect()
    bus.read()
    emulator.vanish()
    with pytest.raises(BusDisconnectedError):
        for _ in range(3):
            bus.read()
    assert not bus.connected
    with pytest.raises(BusDisconnectedError):
        bus.connect()                       # the link is gone while unplugged
    emulator.reappear()
    bus.connect()
    set_distinct_state(backend, robot.n_joints, base=0.2)
    assert_matches(bus.read(), backend.servo_states(), robot.name)
    assert bus.stats.disconnects >= 1 and bus.stats.connects == 2


def test_lerobot_calibration_programs_homing_offset(tmp_path):
    robot = load_robot("so101")
    backend = StaticBackend(robot.n_joints)
    set_distinct_state(backend, robot.n_joints)
    offsets = [-300, 150, 0, 700, -1024, 40]
    # LeRobot ranges are in Present_Position counts (after the offset); centre them on the robot's zero
    joints = tuple(JointCalibration(servo_id=sid, drive_mode=0, homing_offset=h,
                                    range_min=2048 - h - 900, range_max=2048 - h + 900)
                   for sid, h in zip(robot.bus.ids, offsets))
    path = tmp_path / "so101_follower.json"
    write_lerobot_calibration(path, robot, Calibration(joints, 4096.0, True))
    calibration = load_lerobot_calibration(path, robot)
    with make_emulator(robot, backend) as emulator:
        bus = make_bus(robot, emulator.path, calibration=calibration)
        bus.connect()
        assert_matches(bus.read(), backend.servo_states(), "so101")
        bus.write_goals([0.1] * 6)
        bus.read()
        np.testing.assert_allclose(backend.goals, [0.1] * 6, atol=RAD_PER_COUNT)
        bus.close()


def test_calibration_file_errors(tmp_path):
    robot = load_robot("so101")
    with pytest.raises(CalibrationError, match="does not exist"):
        load_lerobot_calibration(tmp_path / "none.json", robot)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CalibrationError, match="not readable JSON"):
        load_lerobot_calibration(bad, robot)
    bad.write_text('{"shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": 0, "range_min": 0, "range_max": 4000}}')
    with pytest.raises(CalibrationError, match="no entry for joint 'shoulder_lift'"):
        load_lerobot_calibration(bad, robot)
    entries = {j: {"id": 9, "drive_mode": 0, "homing_offset": 0, "range_min": 10, "range_max": 4000}
               for j in robot.joint_names}
    bad.write_text(__import__("json").dumps(entries))
    with pytest.raises(CalibrationError, match="servo id 9"):
        load_lerobot_calibration(bad, robot)


def test_wrong_robot_on_the_bus_is_refused(tmp_path):
    """An OMX driver pointed at an SO-101 bus gets a clear error, not garbage."""
    so101, omx = load_robot("so101"), load_robot("omx")
    with make_emulator(so101, StaticBackend(so101.n_joints)) as emulator:
        bus = make_bus(omx, emulator.path)
        with pytest.raises(Exception, match=r"reading register|model"):
            bus.connect()
        assert not bus.connected


def test_omx_reads_hardware_error_in_the_same_indirect_block(tmp_path):
    """Torque off at connect: indirect addresses point at [hardware error + telemetry], one read per
    cycle. Torque already on (a reconnect while holding): the driver does not drop the arm to set them."""
    robot = load_robot("omx")
    backend = StaticBackend(robot.n_joints)
    set_distinct_state(backend, robot.n_joints)
    backend.set_state(3, hardware_error=0x20)
    with make_emulator(robot, backend) as emulator:
        bus = make_bus(robot, emulator.path)
        bus.connect()
        assert bus.indirect_active, bus.indirect_note
        requests = emulator.stats.requests
        sample = bus.read()
        assert emulator.stats.requests == requests + 1          # one sync read, nothing else
        assert sample.hardware_error.tolist() == [0, 0, 0, 0x20, 0]
        assert_matches(sample, backend.servo_states(), "omx")
        bus.set_torque(True)
        bus.close()
        bus.connect()                                           # indirect already set: kept
        assert bus.indirect_active
        assert_matches(bus.read(), backend.servo_states(), "omx")
        bus.close()
    with make_emulator(robot, backend, initial_torque=True) as emulator:   # fresh servos, torque on
        bus = make_bus(robot, emulator.path)
        bus.connect()
        assert not bus.indirect_active and "torque on" in bus.indirect_note
        assert backend.torque_enabled == [True] * robot.n_joints
        sample = bus.read()
        assert_matches(sample, backend.servo_states(), "omx")
        assert sample.hardware_error.tolist() == [0, 0, 0, 0x20, 0]
        bus.close()
