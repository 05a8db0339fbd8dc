"""Twin-arm teleop: leader bus -> teleop_node -> /joint_commands -> follower driver_node -> follower bus."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ros_probe import wait_for

from na_description.robot_table import load_robot
from na_msgs.msg import ActuatorState
from na_sim.bus import StaticBackend, make_emulator

pytestmark = pytest.mark.ros
RAD_PER_COUNT = 2 * math.pi / 4096


def test_leader_moves_follower_and_goal_is_logged(processes, ros_probe, tmp_path):
    robot = load_robot("so101")
    leader, follower = StaticBackend(robot.n_joints), StaticBackend(robot.n_joints)
    leader.torque_enabled = [True] * robot.n_joints          # as if left on: the teleop node must release it
    leader_bus = make_emulator(robot, leader, link=str(tmp_path / "ttyLEADER"))
    follower_bus = make_emulator(robot, follower, link=str(tmp_path / "ttyFOLLOWER"))
    leader_bus.start()
    follower_bus.start()
    try:
        ros_probe.subscribe(ActuatorState, "/actuator_states")
        drv = processes.python(["-m", "na_driver.driver_node", "--ros-args", "-p", "robot:=so101",
                                "-p", f"port:={follower_bus.path}", "-p", "rate_hz:=100"])
        tel = processes.python(["-m", "na_driver.teleop_node", "--ros-args", "-p", "robot:=so101",
                                "-p", f"port:={leader_bus.path}", "-p", "rate_hz:=100"])
        wait_for(lambda: ros_probe.count("/actuator_states") > 0, 30.0, "follower telemetry", drv)
        hand_guided = [0.3, -0.4, 0.5, -0.2, 1.0, 2.5]       # last one beyond the gripper limit (1.745)
        for j, q in enumerate(hand_guided):
            leader.set_state(j, position=q)
        expected = np.clip(hand_guided, robot.position_min, robot.position_max)
        wait_for(lambda: follower.goals[0] is not None
                 and np.allclose(follower.goals, expected, atol=2 * RAD_PER_COUNT), 30.0,
                 "the follower at the leader's pose", tel)
        # The published telemetry trails the goal write by up to one bus cycle: wait for a sample
        # read after the follower got there.
        wait_for(lambda: np.allclose(ros_probe.messages("/actuator_states")[-1].position, expected,
                                     atol=2 * RAD_PER_COUNT), 10.0, "telemetry of the reached pose", drv)
        assert leader.torque_enabled == [False] * robot.n_joints
        assert leader.goals == [None] * robot.n_joints         # nothing is ever written to the leader's goals
        last = ros_probe.messages("/actuator_states")[-1]
        np.testing.assert_allclose(last.goal_position, expected, atol=2 * RAD_PER_COUNT)
        np.testing.assert_allclose(last.position, expected, atol=2 * RAD_PER_COUNT)
        assert processes.stop(tel) == 0 and processes.stop(drv) == 0
    finally:
        leader_bus.stop()
        follower_bus.stop()
