"""Emulated bus (na_sim) -> driver_node process -> /actuator_states in this process, and back."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from ros_probe import wait_for
from sensor_msgs.msg import JointState

from na_description.robot_table import load_robot
from na_msgs.msg import ActuatorState
from na_sim.bus import StaticBackend, make_emulator

pytestmark = pytest.mark.ros

RAD_PER_COUNT = 2 * math.pi / 4096


def start_driver(processes, robot: str, port: str, rate_hz: float = 100.0, extra: tuple[str, ...] = ()):
    args = ["-m", "na_driver.driver_node", "--ros-args", "-p", f"robot:={robot}", "-p", f"port:={port}",
            "-p", f"rate_hz:={rate_hz}", "-p", "reconnect_period_s:=0.2"]
    for item in extra:
        args += ["-p", item]
    return processes.python(args)


def command(names, positions) -> JointState:
    msg = JointState()
    msg.name = list(names)
    msg.position = [float(p) for p in positions]
    return msg


@pytest.mark.parametrize("robot_name", ["so101", "omx"])
def test_driver_node_streams_obeys_and_recovers(robot_name, processes, ros_probe, tmp_path):
    robot = load_robot(robot_name)
    n = robot.n_joints
    backend = StaticBackend(n)
    for j in range(n):
        backend.set_state(j, position=0.1 * j - 0.2, velocity=0.3 - 0.1 * j, load=0.05 * j - 0.1,
                          current=0.2 - 0.05 * j, voltage=12.2, temperature=33.0 + j)
    emulator = make_emulator(robot, backend, link=str(tmp_path / "ttyARM"))
    emulator.start()
    try:
        ros_probe.subscribe(ActuatorState, "/actuator_states")
        ros_probe.subscribe(JointState, "/joint_states")
        ros_probe.subscribe(DiagnosticArray, "/diagnostics", qos=10)
        driver = start_driver(processes, robot_name, emulator.path)
        wait_for(lambda: ros_probe.count("/actuator_states") >= 5, 30.0, "first /actuator_states", driver)

        # telemetry matches what the simulated servos report, stamped at read time
        msg = ros_probe.messages("/actuator_states")[-1]
        states = backend.servo_states()
        assert list(msg.name) == list(robot.joint_names)
        np.testing.assert_allclose(msg.position, [s.position for s in states], atol=1.5 * RAD_PER_COUNT)
        np.testing.assert_allclose(msg.load, [s.load for s in states], atol=2e-3)
        np.testing.assert_allclose(msg.voltage, [12.2] * n, atol=0.051)
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        assert abs(stamp - time.time()) < 5.0
        assert ros_probe.count("/joint_states") > 0
        # torque on start holds the measured pose
        assert backend.torque_enabled == [True] * n
        np.testing.assert_allclose(msg.goal_position, [s.position for s in states], atol=1.5 * RAD_PER_COUNT)

        # /joint_commands: clamped to the limits, approached at most max_step per cycle
        pub = ros_probe.publisher(JointState, "/joint_commands")
        wait_for(lambda: pub.get_subscription_count() > 0, 20.0, "driver subscribed to /joint_commands", driver)
        target = [0.0] * n
        target[0] = 0.45
        target[1] = 99.0                        # far beyond the limit: must be clamped
        t0 = time.monotonic()
        expected = list(target)
        expected[1] = robot.position_max[1]

        def arrived() -> bool:   # commands stream (best effort, as a leader arm sends them)
            pub.publish(command(robot.joint_names, target))
            return (abs(backend.goals[0] - 0.45) < 2 * RAD_PER_COUNT
                    and abs(backend.goals[1] - expected[1]) < 2 * RAD_PER_COUNT)
        wait_for(arrived, 20.0, "the arm at the command", driver, interval=0.05)
        goals = np.array([m.goal_position for m in ros_probe.since("/actuator_states", t0)])
        steps = np.abs(np.diff(goals, axis=0))
        assert steps.max() <= robot.max_step_per_cycle + 1e-9
        assert (np.abs(goals[:, 1]) <= robot.position_max[1] + 1e-9).all()
        np.testing.assert_allclose(backend.servo_states()[1].position, robot.position_max[1], atol=2 * RAD_PER_COUNT)

        # unplug: nothing is published while the adapter is gone; diagnostics raise an error
        emulator.vanish()
        time.sleep(0.3)
        gone = time.monotonic()
        time.sleep(1.5)
        assert ros_probe.since("/actuator_states", gone) == []
        wait_for(lambda: any(s.level == DiagnosticStatus.ERROR and s.name.endswith(": bus")
                             for d in ros_probe.since("/diagnostics", gone) for s in d.status),
                 5.0, "an ERROR bus diagnostic while unplugged", driver)
        # replug at the same path: fresh telemetry resumes
        backend.set_state(2, position=0.3)
        emulator.reappear()
        back = time.monotonic()
        wait_for(lambda: len(ros_probe.since("/actuator_states", back)) >= 5, 20.0, "telemetry after replug", driver)
        np.testing.assert_allclose(ros_probe.since("/actuator_states", back)[-1].position[2], 0.3,
                                   atol=1.5 * RAD_PER_COUNT)

        # a clean stop turns the torque off
        assert processes.stop(driver) == 0
        assert backend.torque_enabled == [False] * n
    finally:
        emulator.stop()


@pytest.mark.slow
@pytest.mark.parametrize("robot_name", ["so101", "omx"])
def test_driver_node_with_simulated_arm(robot_name, processes, ros_probe, tmp_path):
    """MuJoCo arm (na_sim SimulatedArm) behind the emulated bus: the node reports what the physics
    does (position, gravity load) and /joint_commands move the simulated arm."""
    from na_sim.arm import SimulatedArm

    robot = load_robot(robot_name)
    arm = SimulatedArm(robot_name, seed=1)
    arm.start()
    emulator = make_emulator(robot, arm, link=str(tmp_path / "ttySIM"))
    emulator.start()
    try:
        ros_probe.subscribe(ActuatorState, "/actuator_states")
        driver = start_driver(processes, robot_name, emulator.path, rate_hz=60.0)
        wait_for(lambda: ros_probe.count("/actuator_states") >= 30, 30.0, "telemetry from the simulated arm", driver)
        # The servos power up with torque off; the driver turns it on at its first good read (retrying a
        # failed write), which on a loaded machine can come after the first telemetry. Wait for it, then
        # command the upright start pose, where gravity loads the arm, and hold it there.
        wait_for(lambda: bool(arm.bank.torque_enabled.all()), 20.0, "the driver turned every servo's torque on",
                 driver)
        pub = ros_probe.publisher(JointState, "/joint_commands")
        wait_for(lambda: pub.get_subscription_count() > 0, 20.0, "driver subscribed to /joint_commands", driver)
        upright = np.zeros(robot.n_joints)

        def upright_reached() -> bool:
            pub.publish(command(robot.joint_names, upright))
            return bool(np.abs(arm.joint_positions() - upright).max() < 0.05)
        wait_for(upright_reached, 20.0, "the simulated arm back at its upright start pose", driver, interval=0.05)
        time.sleep(1.0)                                   # let the arm settle on its goals

        def reported_vs_sim() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            msg = ros_probe.messages("/actuator_states")[-1]
            states = arm.servo_states()
            return (np.array(msg.position), np.array([s.position for s in states]),
                    np.array(msg.load), np.array([s.load for s in states]))
        pos, sim_pos, load, sim_load = reported_vs_sim()
        np.testing.assert_allclose(pos, sim_pos, atol=0.02)
        np.testing.assert_allclose(load, sim_load, atol=0.05)
        assert np.abs(load).max() > 0.005, "gravity should show in the load register of a held arm"

        target = sim_pos.copy()
        target[0] = 0.35

        def moved() -> bool:
            pub.publish(command(robot.joint_names, target))
            return abs(arm.joint_positions()[0] - 0.35) < 0.05
        wait_for(moved, 20.0, "the simulated arm at the commanded pan angle", driver, interval=0.05)
        msg = ros_probe.messages("/actuator_states")[-1]
        assert abs(msg.goal_position[0] - 0.35) < 1e-9
        assert processes.stop(driver) == 0
    finally:
        emulator.stop()
        arm.stop()


def test_driver_node_under_bus_faults(processes, ros_probe, tmp_path):
    """Drops, corrupt and late replies at the node level: every published sample is fresh (its
    position matches the backend's moving value at its stamp), failures raise diagnostics, data flows."""
    import threading

    from na_sim.bus import FaultSpec

    robot = load_robot("so101")
    backend = StaticBackend(robot.n_joints)
    slope = 0.5                                                    # rad/s ramp on joint 0

    def ramp(t: float) -> float:
        return (t * slope) % 2.0 - 1.0

    stop = threading.Event()

    def move() -> None:
        while not stop.is_set():
            backend.set_state(0, position=ramp(time.time()))
            time.sleep(0.001)
    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    emulator = make_emulator(robot, backend, link=str(tmp_path / "ttyFAULT"),
                             faults=FaultSpec.parse("drop=0.02,corrupt=0.02,late=0.004,late_ms=150,seed=3"))
    emulator.start()
    try:
        ros_probe.subscribe(ActuatorState, "/actuator_states")
        ros_probe.subscribe(DiagnosticArray, "/diagnostics", qos=10)
        driver = start_driver(processes, "so101", emulator.path, rate_hz=100.0, extra=("torque_on_start:=false",))
        wait_for(lambda: ros_probe.count("/actuator_states") >= 300, 40.0, "300 samples through the faults", driver)
        messages = ros_probe.messages("/actuator_states")
        stamps = np.array([m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in messages])
        assert np.all(np.diff(stamps) > 0), "a sample was published twice or out of order"
        # the value read must be the backend's value at read time (measured lag here: <= 10 ms, 0.005 rad);
        # a late reply taken for a fresh one is >= 100 ms old and would lag by >= 0.05 rad
        lag = np.array([(ramp(s) - m.position[0] + 1.0) % 2.0 - 1.0 for s, m in zip(stamps, messages)])
        assert np.all(lag >= -2 * RAD_PER_COUNT), "a sample from the future?"
        assert np.all(lag <= 0.02), f"stale sample published as fresh: lag {lag.max():.4f} rad"
        wait_for(lambda: any(s.level == DiagnosticStatus.WARN and "communication errors" in s.message
                             for d in ros_probe.messages("/diagnostics") for s in d.status),
                 10.0, "a per-servo communication-error diagnostic", driver)
        assert emulator.stats.dropped + emulator.stats.corrupted + emulator.stats.late > 0
    finally:
        stop.set()
        mover.join()
        emulator.stop()


def test_driver_node_with_lerobot_calibration_and_echoing_adapter(processes, ros_probe, tmp_path):
    """A LeRobot calibration file (homing offsets programmed, range narrows the limits) on an adapter
    that echoes every request (detected automatically)."""
    from na_driver.calibration import Calibration, JointCalibration, write_lerobot_calibration
    from na_sim.bus import FaultSpec

    robot = load_robot("so101")
    backend = StaticBackend(robot.n_joints)
    for j in range(robot.n_joints):
        backend.set_state(j, position=0.05 * j)
    offsets = [100, -200, 300, -400, 500, -600]
    half_range = 500                       # counts: +-0.767 rad around the robot's zero
    cal = Calibration(tuple(JointCalibration(sid, 0, h, 2048 - h - half_range, 2048 - h + half_range)
                            for sid, h in zip(robot.bus.ids, offsets)), 4096.0, True)
    cal_file = tmp_path / "so101_follower.json"
    write_lerobot_calibration(cal_file, robot, cal)
    emulator = make_emulator(robot, backend, link=str(tmp_path / "ttyECHO"), faults=FaultSpec(echo=True))
    emulator.start()
    try:
        ros_probe.subscribe(ActuatorState, "/actuator_states")
        driver = start_driver(processes, "so101", emulator.path, extra=(f"calibration_file:={cal_file}",))
        wait_for(lambda: ros_probe.count("/actuator_states") >= 3, 30.0, "telemetry", driver)
        msg = ros_probe.messages("/actuator_states")[-1]
        np.testing.assert_allclose(msg.position, [0.05 * j for j in range(robot.n_joints)], atol=1.5 * RAD_PER_COUNT)
        pub = ros_probe.publisher(JointState, "/joint_commands")
        wait_for(lambda: pub.get_subscription_count() > 0, 20.0, "driver subscribed", driver)
        limit = half_range * RAD_PER_COUNT

        def clamped() -> bool:          # 1.5 rad is inside the table's limit, outside the calibrated range
            pub.publish(command(["shoulder_pan"], [1.5]))
            return abs(backend.servo_states()[0].position - limit) < 2 * RAD_PER_COUNT
        wait_for(clamped, 20.0, "shoulder_pan clamped to the calibrated range", driver, interval=0.05)
        assert emulator.stats.echoed_bytes > 0
    finally:
        emulator.stop()
