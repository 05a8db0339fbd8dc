"""Helper process for test_msgs_cross_process: publishes one filled na_msgs message of the type named
on the command line, after its subscriber has matched, until it is told to stop."""

from __future__ import annotations

import math
import sys

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node

from na_msgs.msg import ActuatorState, ExternalForceEstimate, MotorCondition


def sample(kind: str):
    """A message with every field set to a distinctive value (the test checks each one)."""
    if kind == "ActuatorState":
        msg = ActuatorState()
        msg.header.frame_id = ""
        msg.header.stamp.sec, msg.header.stamp.nanosec = 1700000000, 123456789
        msg.name = ["shoulder_pan", "gripper"]
        msg.position, msg.velocity = [0.5, -1.25], [0.1, -0.2]
        msg.goal_position, msg.current = [0.55, -1.2], [0.13, math.nan]
        msg.load, msg.voltage, msg.temperature = [-0.35, 0.9], [12.1, 12.0], [35.0, 41.0]
        msg.hardware_error = [0, 32]
        return msg
    if kind == "ExternalForceEstimate":
        msg = ExternalForceEstimate()
        msg.header.frame_id = "base"
        msg.header.stamp.sec, msg.header.stamp.nanosec = 1700000001, 5
        msg.force.x, msg.force.y, msg.force.z = 0.1, -0.2, -2.9
        msg.force_raw.x, msg.force_raw.y, msg.force_raw.z = 0.11, -0.21, -3.0
        msg.contact_probability, msg.in_contact = 0.97, True
        return msg
    if kind == "MotorCondition":
        msg = MotorCondition()
        msg.header.stamp.sec = 1700000002
        msg.name = ["joint1", "joint2", "joint3"]
        msg.score, msg.degraded = [0.99, 0.95, 0.05], [False, False, True]
        return msg
    raise SystemExit(f"unknown message type {kind}")


def main() -> None:
    kind, topic = sys.argv[1], sys.argv[2]
    rclpy.init()
    node = Node("na_msgs_test_publisher")
    msg = sample(kind)
    pub = node.create_publisher(type(msg), topic, 10)
    try:
        while rclpy.ok():
            if pub.get_subscription_count() > 0:
                pub.publish(msg)
            rclpy.spin_once(node, timeout_sec=0.05)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
