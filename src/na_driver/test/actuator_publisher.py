"""Test helper process: publishes a known ActuatorState (+ WrenchStamped) sequence at ~100 Hz.

Usage: actuator_publisher.py ROBOT SECONDS. Sample k is fully determined by k (see ``sample_values``),
and position[0] = k * 1e-3 so a consumer can tell which sample a recorded row came from.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np


def sample_values(k: int, n: int) -> dict[str, np.ndarray]:
    j = np.arange(n)
    return {
        "position": k * 1e-3 + 0.01 * j,
        "goal_position": k * 1e-3 + 0.01 * j + 0.02,
        "velocity": math.sin(k / 10) + 0.1 * j,
        "load": 0.3 * math.cos(k / 7) - 0.05 * j,
        "current": 0.5 * math.sin(k / 5) + 0.01 * j,
        "voltage": 12.0 + 0.1 * (k % 5) + 0 * j,
        "temperature": 30.0 + (k % 3) + j,
        "force": np.array([math.sin(k / 9), -2.0 + 0.01 * k, 3.5 * math.cos(k / 4)]),
    }


def main() -> None:
    import rclpy
    from geometry_msgs.msg import WrenchStamped
    from rclpy.qos import qos_profile_sensor_data

    from na_description.robot_table import load_robot
    from na_msgs.msg import ActuatorState

    robot = load_robot(sys.argv[1])
    seconds = float(sys.argv[2])
    rclpy.init()
    node = rclpy.create_node("actuator_publisher")
    pub = node.create_publisher(ActuatorState, "/actuator_states", qos_profile_sensor_data)
    ft = node.create_publisher(WrenchStamped, "/ft_sensor", qos_profile_sensor_data)
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        if pub.get_subscription_count() == 0:
            time.sleep(0.01)
            continue
        values = sample_values(k, robot.n_joints)
        stamp = node.get_clock().now().to_msg()
        wrench = WrenchStamped()
        wrench.header.stamp = stamp
        wrench.wrench.force.x, wrench.wrench.force.y, wrench.wrench.force.z = map(float, values["force"])
        ft.publish(wrench)
        msg = ActuatorState()
        msg.header.stamp = stamp
        msg.name = list(robot.joint_names)
        for q in ("position", "goal_position", "velocity", "load", "current", "voltage", "temperature"):
            setattr(msg, q, [float(v) for v in values[q]])
        msg.hardware_error = [0] * robot.n_joints
        pub.publish(msg)
        k += 1
        time.sleep(0.01)
    node.destroy_node()
    rclpy.shutdown()


if __name__ == "__main__":
    main()
