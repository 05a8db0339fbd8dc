"""na-record: record /actuator_states (+ force labels) into the robot's NAD CSV, optionally an MCAP bag.

Force labels come from an F/T sensor (a geometry_msgs/WrenchStamped topic: the latest reading
within --force-max-age of each sample) or from a declared payload mass (force_z = -m g while the
holding flag is true, -999 otherwise; x and y -999). The NAD columns, units and rounding live in
na_inference.nad (write_trajectory); this module only collects samples. On Ctrl-C (or after
--duration / --max-samples) the file is written; nothing is written when nothing was received.

Example:  na-record --robot so101 --output run.csv --payload-kg 0.3 --holding-topic /holding
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from na_description.robot_table import RobotTable, load_robot

GRAVITY = 9.81
QUANTITIES = ("position", "goal_position", "velocity", "load", "current", "voltage", "temperature")


class NadRecording:
    """Samples of one trajectory in physical units, turned into a na_inference.nad Trajectory."""

    def __init__(self, robot: RobotTable, payload_kg: float | None = None, task: str = "",
                 force_max_age: float = 0.1) -> None:
        if robot.nad_schema not in ("so101", "omx"):
            raise ValueError(f"na-record writes the servo-arm NAD schemas (so101, omx); {robot.name} uses "
                             f"{robot.nad_schema!r}, whose columns (tau, tau_ext, motor_pos ...) /actuator_states lacks")
        self.robot = robot
        self.payload_kg = payload_kg
        self.task = task
        self.stamps: list[float] = []
        self.rows: dict[str, list[np.ndarray]] = {q: [] for q in QUANTITIES}
        self.forces: list[np.ndarray] = []
        self.skipped: list[str] = []
        self.force_max_age = force_max_age
        self.wrench_stamps: list[float] = []     # F/T readings, matched to samples by stamp at the end
        self.wrenches: list[np.ndarray] = []

    def add_wrench(self, stamp_s: float, force: Sequence[float]) -> None:
        """One F/T reading (N). Each sample gets the reading nearest its stamp (within force_max_age)."""
        self.wrench_stamps.append(stamp_s)
        self.wrenches.append(np.asarray(force, dtype=np.float64))

    def add(self, stamp_s: float, names: Sequence[str], fields: dict[str, Sequence[float]],
            force: Sequence[float] | None) -> bool:
        """Append one sample (fields by quantity, joints named); returns False (and notes why) if unusable."""
        if list(names) != list(self.robot.joint_names):
            self.skipped.append(f"joint names {list(names)} are not the {self.robot.name} joints")
            return False
        arrays = {}
        for q in QUANTITIES:
            values = np.asarray(fields[q], dtype=np.float64)
            if values.shape != (self.robot.n_joints,):
                self.skipped.append(f"{q} has {values.size} values")
                return False
            if q != "goal_position" and not np.all(np.isfinite(values)):
                self.skipped.append(f"{q} is not finite at t={stamp_s:.3f}")
                return False
            arrays[q] = values
        if not np.all(np.isfinite(arrays["goal_position"])):
            arrays["goal_position"] = np.where(np.isfinite(arrays["goal_position"]), arrays["goal_position"],
                                               arrays["position"])   # no command yet: the goal is to stay
        for q, values in arrays.items():
            self.rows[q].append(values)
        self.stamps.append(stamp_s)
        self.forces.append(np.full(3, np.nan) if force is None else np.asarray(force, dtype=np.float64))
        return True

    def __len__(self) -> int:
        return len(self.stamps)

    def trajectory(self):
        from na_inference.nad import Trajectory, add_gripper_aperture

        if not self.stamps:
            raise ValueError("nothing was recorded")
        stamps = np.asarray(self.stamps)
        quantities = {q: np.vstack(v) for q, v in self.rows.items()}
        force = np.vstack(self.forces)
        if self.wrenches:
            force = self._match_wrenches(stamps)
        add_gripper_aperture(self.robot.name, quantities)   # the OMX's NAD gripper opening (mm)
        return Trajectory(robot=self.robot.name, path=None, task=self.task, payload_kg=self.payload_kg,
                          time=stamps - stamps[0], quantities=quantities, force=force)

    def _match_wrenches(self, stamps: np.ndarray) -> np.ndarray:
        order = np.argsort(self.wrench_stamps)
        w_stamps = np.asarray(self.wrench_stamps)[order]
        w_force = np.vstack(self.wrenches)[order]
        force = np.full((len(stamps), 3), np.nan)
        right = np.clip(np.searchsorted(w_stamps, stamps), 0, len(w_stamps) - 1)
        left = np.clip(right - 1, 0, len(w_stamps) - 1)
        nearest = np.where(np.abs(w_stamps[left] - stamps) <= np.abs(w_stamps[right] - stamps), left, right)
        ok = np.abs(w_stamps[nearest] - stamps) <= self.force_max_age
        force[ok] = w_force[nearest[ok]]
        return force

    def write_csv(self, path: str | Path) -> Path:
        from na_inference.nad import write_trajectory

        write_trajectory(path, self.trajectory())
        return Path(path)


def payload_force(payload_kg: float, holding: bool) -> np.ndarray | None:
    """NAD payload label: (-999, -999, -m g) while holding, all -999 otherwise."""
    if not holding:
        return None
    return np.array([math.nan, math.nan, -payload_kg * GRAVITY])


def ros2msg_definition(package: str, message: str) -> str:
    """A message definition with its dependencies, in the ros2msg layout MCAP readers expect."""
    from ament_index_python.packages import get_package_share_directory

    def text(pkg: str, name: str) -> str:
        return (Path(get_package_share_directory(pkg)) / "msg" / f"{name}.msg").read_text()

    primitive = {"bool", "byte", "char", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
                 "uint32", "int64", "uint64", "string", "wstring"}
    out, seen, todo = [text(package, message)], set(), [(package, message)]
    while todo:
        pkg, name = todo.pop()
        for line in text(pkg, name).splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            kind = line.split()[0].split("[")[0].split("<")[0]
            if kind in primitive or "=" in line.split()[1 if len(line.split()) > 1 else 0]:
                continue
            dep = tuple(kind.split("/")) if "/" in kind else (pkg, kind)
            if kind == "Header":
                dep = ("std_msgs", "Header")
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
                out.append("=" * 80 + f"\nMSG: {dep[0]}/{dep[1]}\n" + text(*dep))
    return "\n".join(out)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="na-record", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--robot", default="so101", help="robot table (so101, omx)")
    parser.add_argument("--output", required=True, help="NAD CSV file to write")
    parser.add_argument("--topic", default="/actuator_states", help="na_msgs/ActuatorState topic")
    parser.add_argument("--force-topic", default="", help="geometry_msgs/WrenchStamped from an F/T sensor")
    parser.add_argument("--force-max-age", type=float, default=0.1,
                        help="s; a sample without an F/T reading this close in stamp gets -999")
    parser.add_argument("--payload-kg", type=float, default=None, help="payload mass for force_z = -m g labels")
    parser.add_argument("--holding", action="store_true", help="the payload is held for the whole recording")
    parser.add_argument("--holding-topic", default="", help="std_msgs/Bool: true while the payload is held")
    parser.add_argument("--duration", type=float, default=0.0, help="s to record (0 = until Ctrl-C)")
    parser.add_argument("--max-samples", type=int, default=0, help="stop after this many samples (0 = no limit)")
    parser.add_argument("--task", default="", help="task name kept with the trajectory")
    parser.add_argument("--mcap", default="", help="also write the received messages to this MCAP bag")
    args = parser.parse_args(list(argv))
    if args.force_topic and args.payload_kg is not None:
        parser.error("use either --force-topic (F/T sensor) or --payload-kg (payload labels), not both")
    if (args.holding or args.holding_topic) and args.payload_kg is None:
        parser.error("--holding/--holding-topic need --payload-kg")
    if args.payload_kg is not None and not (args.payload_kg >= 0 and math.isfinite(args.payload_kg)):
        parser.error("--payload-kg must be a non-negative number")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import rclpy
    from geometry_msgs.msg import WrenchStamped
    from rclpy.executors import ExternalShutdownException
    from rclpy.qos import qos_profile_sensor_data
    from rclpy.utilities import remove_ros_args
    from std_msgs.msg import Bool

    from na_msgs.msg import ActuatorState

    argv = list(sys.argv if argv is None else argv)
    args = parse_args(remove_ros_args(argv)[1:])
    robot = load_robot(args.robot)
    recording = NadRecording(robot, args.payload_kg, args.task, force_max_age=args.force_max_age)
    state = {"holding": bool(args.holding), "closed": False}
    mcap = None
    if args.mcap:
        from mcap_ros2.writer import Writer

        mcap_file = open(args.mcap, "wb")  # noqa: SIM115 (closed in finally)
        mcap = Writer(mcap_file)
        schema = mcap.register_msgdef("na_msgs/msg/ActuatorState", ros2msg_definition("na_msgs", "ActuatorState"))

    rclpy.init(args=argv)
    node = rclpy.create_node("na_record")
    log = node.get_logger()

    def on_state(msg) -> None:
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        if state["closed"]:
            return
        force = payload_force(args.payload_kg, state["holding"]) if args.payload_kg is not None else None
        fields = {q: getattr(msg, q) for q in QUANTITIES}
        if not recording.add(stamp, msg.name, fields, force):
            log.warning(f"sample skipped: {recording.skipped[-1]}", throttle_duration_sec=2.0)
        elif mcap is not None:
            mcap.write_message(args.topic, schema, msg, log_time=time.time_ns(),
                               publish_time=msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec)

    def on_wrench(msg) -> None:
        recording.add_wrench(msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9,
                             (msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z))

    def on_holding(msg) -> None:
        state["holding"] = bool(msg.data)

    node.create_subscription(ActuatorState, args.topic, on_state, qos_profile_sensor_data)
    if args.force_topic:
        node.create_subscription(WrenchStamped, args.force_topic, on_wrench, qos_profile_sensor_data)
    if args.holding_topic:
        node.create_subscription(Bool, args.holding_topic, on_holding, 10)
    log.info(f"recording {args.topic} ({robot.display_name}) to {args.output}")
    start = time.monotonic()
    try:
        while rclpy.ok():
            rclpy.spin_once(node, timeout_sec=0.1)
            if args.duration and time.monotonic() - start >= args.duration:
                break
            if args.max_samples and len(recording) >= args.max_samples:
                break
        state["closed"] = True           # F/T readings of the last samples may still be in flight
        settle = time.monotonic() + (args.force_max_age if args.force_topic else 0.0)
        while rclpy.ok() and time.monotonic() < settle:
            rclpy.spin_once(node, timeout_sec=0.02)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
        if mcap is not None:
            mcap.finish()
            mcap_file.close()
    if not len(recording):
        print(f"na-record: no {args.topic} samples received; nothing written", file=sys.stderr)
        return 1
    path = recording.write_csv(args.output)
    print(f"na-record: wrote {len(recording)} samples to {path}" + (f" and {args.mcap}" if args.mcap else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
