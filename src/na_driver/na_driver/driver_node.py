"""driver_node: one servo arm (SO-101 over Feetech, OMX over Dynamixel) as a ROS 2 node.

Publishes /joint_states and /actuator_states stamped at bus read time (sensor-data QoS), obeys
/joint_commands (clamped to the joint limits and to max_step_per_cycle), reports /diagnostics per
servo and for the bus. A thin shell over DriverCore: the bus loop runs in its own thread at rate_hz,
ROS callbacks only hand commands over.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import JointState

from na_description.robot_table import RobotTableError, load_robot
from na_driver.bus import ServoBus, make_bus
from na_driver.calibration import CalibrationError, default_calibration, load_lerobot_calibration
from na_driver.driver_core import CommandLimiter, CycleResult, DriverCore
from na_driver.ros_common import actuator_state_msg, declare, joint_state_msg, status
from na_msgs.msg import ActuatorState

ECHO_MODES = {"auto": None, "on": True, "off": False}


class DriverNode(Node):
    """Follower role: torque on, obeys commands. Leader role (teleop_node): torque off, read only,
    and publishes what it reads as the follower's command."""

    def __init__(self, node_name: str = "na_driver", leader: bool = False, **kwargs) -> None:
        super().__init__(node_name, **kwargs)
        self.leader = leader
        robot_name = declare(self, "robot", "so101", "Robot table name (so101, omx)")
        try:
            self.robot = load_robot(robot_name)
        except RobotTableError as exc:
            raise SystemExit(f"{node_name}: {exc}") from exc
        port = declare(self, "port", "/dev/ttyACM0" if not leader else "/dev/ttyACM1",
                       "Serial device of the servo bus (a stable /dev/serial/by-id path is best)")
        baudrate = declare(self, "baudrate", 0, "Bus baud rate; 0 = the robot table's", int_range=(0, 4_500_000))
        self.rate_hz = declare(self, "rate_hz", 100.0, "Bus read/publish rate", float_range=(1.0, 1000.0))
        torque_on_start = declare(self, "torque_on_start", not leader,
                                  "Engage torque after the first read (holding the measured pose)")
        torque_off = declare(self, "torque_off_on_shutdown", not leader, "Disable torque when the node stops")
        pmin = declare(self, "position_min", list(self.robot.position_min),
                       "Lower joint limits in rad, robot-table order (commands are clamped)")
        pmax = declare(self, "position_max", list(self.robot.position_max),
                       "Upper joint limits in rad, robot-table order (commands are clamped)")
        max_step = declare(self, "max_step_per_cycle", self.robot.max_step_per_cycle,
                           "Largest goal change per cycle in rad (limits speed toward a command)",
                           float_range=(1e-4, 1.0))
        calibration_file = declare(self, "calibration_file", "",
                                   "LeRobot calibration JSON (SO-101); empty = the servos' own zero")
        echo = declare(self, "echo", "auto", "Adapter echoes requests: auto (detect), on, off")
        fast_sync_read = declare(self, "fast_sync_read", False, "Dynamixel: use Fast Sync Read for telemetry")
        reconnect_s = declare(self, "reconnect_period_s", 0.5, "Seconds between reopen attempts after a failure",
                              float_range=(0.05, 10.0))
        self.hw_id = f"{self.robot.name}@{port}"

        if echo not in ECHO_MODES:
            raise SystemExit(f"{node_name}: echo must be one of {', '.join(ECHO_MODES)}, got {echo!r}")
        if len(pmin) != self.robot.n_joints or len(pmax) != self.robot.n_joints:
            raise SystemExit(f"{node_name}: position_min/position_max need {self.robot.n_joints} values")
        try:
            calibration = (load_lerobot_calibration(calibration_file, self.robot) if calibration_file
                           else default_calibration(self.robot))
            self.bus: ServoBus = make_bus(self.robot, port, baudrate=baudrate or None, calibration=calibration,
                                          echo=ECHO_MODES[echo], fast_sync_read=fast_sync_read)
            if calibration_file:     # never command beyond the range the user calibrated either
                ranges = [calibration.range_radians(j) for j in range(self.robot.n_joints)]
                pmin = [max(a, r[0]) for a, r in zip(pmin, ranges)]
                pmax = [min(b, r[1]) for b, r in zip(pmax, ranges)]
            limiter = CommandLimiter(self.robot.joint_names, pmin, pmax, max_step)
        except (CalibrationError, ValueError) as exc:
            raise SystemExit(f"{node_name}: {exc}") from exc
        self.core = DriverCore(self.bus, limiter, torque_on_start=torque_on_start and not leader,
                               torque_off_on_shutdown=torque_off, reconnect_period_s=reconnect_s,
                               release_on_start=leader)

        if leader:
            self.command_pub = self.create_publisher(JointState, "joint_commands", qos_profile_sensor_data)
            self.joint_pub = self.create_publisher(JointState, "leader/joint_states", qos_profile_sensor_data)
            self.actuator_pub = self.create_publisher(ActuatorState, "leader/actuator_states", qos_profile_sensor_data)
        else:
            self.joint_pub = self.create_publisher(JointState, "joint_states", qos_profile_sensor_data)
            self.actuator_pub = self.create_publisher(ActuatorState, "actuator_states", qos_profile_sensor_data)
            self.create_subscription(JointState, "joint_commands", self._on_command, qos_profile_sensor_data)
        self.diag_pub = self.create_publisher(DiagnosticArray, "diagnostics", 10)
        self.create_timer(1.0, self._publish_diagnostics)

        self._last_sample = None
        self._last_comm_errors = dict(self.bus.stats.servo_errors)
        self._last_failures = 0
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="bus", daemon=True)
        self._thread.start()
        self.get_logger().info(f"{'leader' if leader else 'driver'} for {self.robot.display_name} on {port} "
                               f"at {self.rate_hz:.0f} Hz ({self.robot.bus.servo_model}, ids {list(self.robot.bus.ids)})")

    # --- bus loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        period = 1.0 / self.rate_hz
        next_tick = time.monotonic()
        was_ok = None
        while not self._stop.is_set():
            result = self.core.cycle()
            if not self.context.ok():      # ROS shut down under us (signal): stop; close() turns torque off
                break
            if result.sample is not None:
                self._publish(result)
                if was_ok is False:
                    self.get_logger().info("bus recovered: publishing fresh telemetry again")
                was_ok = True
            else:
                if was_ok is not False:
                    self.get_logger().warning(f"bus cycle failed, publishing nothing until it recovers: {result.error}")
                was_ok = False
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_tick = time.monotonic()     # overrun: do not try to catch up with a burst

    def _publish(self, result: CycleResult) -> None:
        sample = result.sample
        names = self.robot.joint_names
        self._last_sample = sample
        self.joint_pub.publish(joint_state_msg(names, sample))
        self.actuator_pub.publish(actuator_state_msg(names, sample, self.core.last_goal))
        if self.leader:
            command = joint_state_msg(names, sample)   # same joint mapping; clamped to the same limits
            limiter = self.core.limiter
            command.position = np.clip(sample.position, limiter.position_min, limiter.position_max).tolist()
            command.velocity = []
            self.command_pub.publish(command)

    def _on_command(self, msg: JointState) -> None:
        problems = self.core.limiter.set_command(list(msg.name), list(msg.position))
        if problems:
            self.get_logger().warning(f"/joint_commands: {'; '.join(problems)}", throttle_duration_sec=2.0)

    # --- diagnostics -------------------------------------------------------------------------
    def _publish_diagnostics(self) -> None:
        stats, counters = self.bus.stats, self.core.counters
        rate = counters.achieved_rate_hz()
        new_failures = counters.read_failures - self._last_failures
        self._last_failures = counters.read_failures
        if not self.bus.connected:
            level, message = DiagnosticStatus.ERROR, f"disconnected: {self.core.last_error}"
        elif new_failures:
            level, message = DiagnosticStatus.WARN, f"{new_failures} failed reads in the last second"
        elif rate < 0.9 * self.rate_hz:
            level, message = DiagnosticStatus.WARN, f"loop at {rate:.0f} Hz of {self.rate_hz:.0f} Hz"
        else:
            level, message = DiagnosticStatus.OK, f"{rate:.0f} Hz"
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        array.status.append(status(f"{self.get_name()}: bus", level, message, self.hw_id, {
            "achieved_rate_hz": f"{rate:.1f}", "target_rate_hz": f"{self.rate_hz:.1f}",
            "connected": self.bus.connected, "samples": counters.samples,
            "read_failures": counters.read_failures, "write_failures": counters.write_failures,
            "reconnects": counters.reconnects, "disconnects": stats.disconnects,
            "echo_detected": self.bus.echo_detected, "bytes_discarded": stats.bytes_discarded,
            "commands_received": self.core.limiter.commands_received,
            "commands_rejected": self.core.limiter.commands_rejected, "last_error": self.core.last_error,
            "read_layout": getattr(self.bus, "indirect_note", "telemetry block")}))
        sample = self._last_sample
        for j, (joint, sid) in enumerate(zip(self.robot.joint_names, self.robot.bus.ids)):
            errors = stats.servo_errors.get(sid, 0)
            new_errors = errors - self._last_comm_errors.get(sid, 0)
            hw = int(sample.hardware_error[j]) if sample is not None else 0
            if hw:
                level, message = DiagnosticStatus.ERROR, f"hardware error bits 0x{hw:02x}"
            elif new_errors:
                level, message = DiagnosticStatus.WARN, f"{new_errors} communication errors in the last second"
            elif sample is None:
                level, message = DiagnosticStatus.STALE, "no telemetry yet"
            else:
                level, message = DiagnosticStatus.OK, "ok"
            values = {"servo_id": sid, "communication_errors": errors, "hardware_error": hw}
            if sample is not None:
                values.update(temperature_c=f"{sample.temperature[j]:.0f}", voltage_v=f"{sample.voltage[j]:.1f}",
                              position_rad=f"{sample.position[j]:.4f}")
            array.status.append(status(f"{self.get_name()}: {joint}", level, message, f"{self.hw_id}#{sid}", values))
        self._last_comm_errors = dict(stats.servo_errors)
        self.diag_pub.publish(array)

    def close(self) -> None:
        """Stop the bus loop, then torque off (when configured) and close the port."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=5.0)
        note = self.core.shutdown()
        print(f"[{self.get_name()}] shutdown: {note}", flush=True)


def run(node_factory) -> None:
    rclpy.init()
    node = None
    try:
        node = node_factory()
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.close()
            node.destroy_node()
        rclpy.try_shutdown()


def main() -> None:
    run(DriverNode)



if __name__ == "__main__":
    main()
