"""franka_bridge: franka_ros2-style /joint_states (with gripper fingers, any order) -> /actuator_states."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ros_probe import wait_for
from sensor_msgs.msg import JointState

from na_description.robot_table import load_robot
from na_driver.franka_bridge import FrankaMapping
from na_msgs.msg import ActuatorState


def test_mapping_picks_arm_joints_and_scales_torque():
    robot = load_robot("panda")
    mapping = FrankaMapping(robot.joint_names, robot.actuator["torque_limit_nm"])
    names = ["panda_finger_joint1", *reversed(robot.joint_names)]
    position = [0.04, *[0.1 * i for i in range(7)]]
    effort = [0.0, *[2.0 * i - 5 for i in range(7)]]
    out = mapping.convert(names, position, position, effort)
    np.testing.assert_allclose(out["position"], [0.1 * i for i in reversed(range(7))])
    np.testing.assert_allclose(out["load"] * np.asarray(robot.actuator["torque_limit_nm"]),
                               [2.0 * i - 5 for i in reversed(range(7))])
    with pytest.raises(ValueError, match="lacks"):
        mapping.convert(names[:-1], position[:-1], position[:-1], effort[:-1])
    with pytest.raises(ValueError, match="not finite"):
        mapping.convert(names, [math.nan] * 8, position, effort)


@pytest.mark.ros
def test_bridge_process_publishes_actuator_states(processes, ros_probe):
    robot = load_robot("panda")
    ros_probe.subscribe(ActuatorState, "/actuator_states")
    bridge = processes.python(["-m", "na_driver.franka_bridge"])
    pub = ros_probe.publisher(JointState, "/joint_states")
    wait_for(lambda: pub.get_subscription_count() > 0, 20.0, "bridge subscribed to /joint_states", bridge)
    msg = JointState()
    msg.name = [*robot.joint_names, "panda_finger_joint1"]
    msg.position = [0.05 * i for i in range(8)]
    msg.velocity = [0.01 * i for i in range(8)]
    msg.effort = [1.5 * i - 4 for i in range(8)]
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1234, 5678

    def arrived() -> bool:
        pub.publish(msg)
        return ros_probe.count("/actuator_states") > 0
    wait_for(arrived, 20.0, "/actuator_states from the bridge", bridge, interval=0.05)
    out = ros_probe.messages("/actuator_states")[0]
    assert list(out.name) == list(robot.joint_names)
    assert (out.header.stamp.sec, out.header.stamp.nanosec) == (1234, 5678)
    np.testing.assert_allclose(out.position, msg.position[:7])
    np.testing.assert_allclose(out.velocity, msg.velocity[:7])
    np.testing.assert_allclose(np.asarray(out.load) * robot.actuator["torque_limit_nm"], msg.effort[:7])
    assert all(math.isnan(v) for v in out.current) and all(math.isnan(v) for v in out.goal_position)
