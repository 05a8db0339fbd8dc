"""teleop_node: the leader arm of a twin-arm (leader/follower) rig.

Reads the leader arm with its torque off (moved by hand) and publishes its joint positions on
/joint_commands, with the follower's joint names and clamped to the same limits; the follower's
driver_node applies them (with its own max-step limit). That command is what NAD calls goal_pos:
the follower publishes it as ActuatorState.goal_position, which na-record logs. The leader's own
telemetry goes to /leader/joint_states and /leader/actuator_states.
"""

from __future__ import annotations

from na_driver.driver_node import DriverNode, run


def main() -> None:
    run(lambda: DriverNode("na_teleop", leader=True))


if __name__ == "__main__":
    main()
