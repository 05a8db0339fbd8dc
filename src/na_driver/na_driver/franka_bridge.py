"""franka_bridge: franka_ros2 topics -> /actuator_states, so the inference node runs unchanged on a Panda.

franka_ros2 publishes sensor_msgs/JointState on /joint_states (position rad, velocity rad/s,
effort = measured link-side joint torque tau_J in N.m) and, from franka_robot_state_broadcaster,
franka_msgs/FrankaRobotState. Field mapping (also in the README):
  ActuatorState.position      <- JointState.position (rad)
  ActuatorState.velocity      <- JointState.velocity (rad/s)
  ActuatorState.load          <- JointState.effort / torque_limit_nm (per joint, robot table), i.e. the
                                 measured torque as a signed fraction of the joint's rated torque
  ActuatorState.goal_position <- FrankaRobotState.desired_joint_state.position when franka_msgs is
                                 importable and a state arrived, else NaN
  ActuatorState.current, voltage, temperature <- NaN (the FCI does not report them)
  ActuatorState.hardware_error <- 0
The header stamp is the incoming JointState's stamp (the time franka_ros2 read the robot).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import JointState

from na_description.robot_table import load_robot
from na_driver.ros_common import declare
from na_msgs.msg import ActuatorState


class FrankaMapping:
    """Pure mapping from franka_ros2 joint states to ActuatorState fields (robot-table order)."""

    def __init__(self, joint_names: Sequence[str], torque_limit_nm: Sequence[float]) -> None:
        self.joint_names = tuple(joint_names)
        self.torque_limit = np.asarray(torque_limit_nm, dtype=np.float64)
        if self.torque_limit.shape != (len(self.joint_names),) or np.any(self.torque_limit <= 0):
            raise ValueError("torque_limit_nm needs one positive value per joint")

    def convert(self, names: Sequence[str], position: Sequence[float], velocity: Sequence[float],
                effort: Sequence[float]) -> dict[str, np.ndarray]:
        """Pick the arm joints by name (the gripper fingers and other joints are ignored)."""
        index = {n: i for i, n in enumerate(names)}
        missing = [n for n in self.joint_names if n not in index]
        if missing:
            raise ValueError(f"joint state lacks {missing}")
        for label, values in (("position", position), ("velocity", velocity), ("effort", effort)):
            if len(values) != len(names):
                raise ValueError(f"joint state has {len(names)} names but {len(values)} {label} values")
        rows = [index[n] for n in self.joint_names]
        out = {
            "position": np.asarray(position, dtype=np.float64)[rows],
            "velocity": np.asarray(velocity, dtype=np.float64)[rows],
            "load": np.asarray(effort, dtype=np.float64)[rows] / self.torque_limit,
        }
        for label, values in out.items():
            if not np.all(np.isfinite(values)):
                raise ValueError(f"{label} is not finite")
        return out


class FrankaBridge(Node):
    def __init__(self) -> None:
        super().__init__("na_franka_bridge")
        robot = load_robot(declare(self, "robot", "panda", "Robot table of the Franka arm"))
        names = declare(self, "joint_names", list(robot.joint_names),
                        "franka_ros2 joint names in robot-table order (e.g. fr3_joint1.. for an FR3)")
        state_topic = declare(self, "robot_state_topic", "franka_robot_state_broadcaster/robot_state",
                              "franka_msgs/FrankaRobotState topic (used when franka_msgs is importable)")
        self.mapping = FrankaMapping(names, robot.actuator["torque_limit_nm"])
        self.out_names = list(robot.joint_names)
        self.goal: np.ndarray | None = None
        self.pub = self.create_publisher(ActuatorState, "actuator_states", qos_profile_sensor_data)
        self.create_subscription(JointState, "joint_states", self._on_joint_state, qos_profile_sensor_data)
        try:
            from franka_msgs.msg import FrankaRobotState
        except ImportError:
            self.get_logger().info("franka_msgs not importable: goal_position is NaN (joint states only)")
        else:
            self.create_subscription(FrankaRobotState, state_topic, self._on_robot_state, qos_profile_sensor_data)
        self.rejected = 0

    def _on_robot_state(self, msg) -> None:
        desired = getattr(msg, "desired_joint_state", None)
        if desired is None or not desired.name:
            return
        try:
            self.goal = self.mapping.convert(desired.name, desired.position, desired.position,
                                             [0.0] * len(desired.name))["position"]
        except ValueError:
            self.goal = None

    def _on_joint_state(self, msg: JointState) -> None:
        try:
            fields = self.mapping.convert(msg.name, msg.position, msg.velocity, msg.effort)
        except ValueError as exc:
            self.rejected += 1
            self.get_logger().warning(f"/joint_states ignored: {exc}", throttle_duration_sec=2.0)
            return
        n = len(self.out_names)
        out = ActuatorState()
        out.header.stamp = msg.header.stamp
        out.name = self.out_names
        out.position = fields["position"].tolist()
        out.velocity = fields["velocity"].tolist()
        out.load = fields["load"].tolist()
        out.goal_position = self.goal.tolist() if self.goal is not None else [math.nan] * n
        out.current = [math.nan] * n
        out.voltage = [math.nan] * n
        out.temperature = [math.nan] * n
        out.hardware_error = [0] * n
        self.pub.publish(out)


def main() -> None:
    rclpy.init()
    node = None
    try:
        node = FrankaBridge()
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
