"""The launch description shared by so101/omx/franka.launch.py (full ROS 2 installs only: launch and
launch_ros are not on PyPI; pip installs use ``na-bringup``, which reads the same stack and YAML)."""

from __future__ import annotations

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from na_bringup.stack import DRIVER, nodes_of, params_file, robot_of, sim_command, sim_link
from na_description.robot_table import load_robot


def robot_launch_description(stack: str) -> LaunchDescription:
    robot = load_robot(robot_of(stack))
    args = [
        DeclareLaunchArgument("sim", default_value="false",
                              description="true: start the simulated arm behind an emulated servo bus"),
        DeclareLaunchArgument("port", default_value="", description="servo bus device (default from the YAML)"),
        DeclareLaunchArgument("model", default_value="", description="ONNX model (default: the robot table's)"),
        DeclareLaunchArgument("rate", default_value="0", description="driver rate in Hz (0 = the YAML's)"),
        DeclareLaunchArgument("scenario", default_value="pick_and_place", description="simulated scenario"),
        DeclareLaunchArgument("rviz", default_value="false", description="start RViz with the force display"),
    ]

    def nodes(context):
        sim = LaunchConfiguration("sim").perform(context).lower() in ("1", "true", "yes")
        port = LaunchConfiguration("port").perform(context)
        model = LaunchConfiguration("model").perform(context)
        rate = float(LaunchConfiguration("rate").perform(context) or 0)
        actions = []
        if sim and robot.bus.family in ("feetech_sts", "dynamixel"):
            link = sim_link(stack)
            port = str(link)
            actions.append(ExecuteProcess(
                cmd=sim_command(stack, link, LaunchConfiguration("scenario").perform(context)), output="screen"))
        for spec in nodes_of(stack):
            overrides = {}
            if spec is DRIVER and port:
                overrides["port"] = port
            if spec is DRIVER and rate > 0:
                overrides["rate_hz"] = rate
            if spec.package == "na_inference" and model:
                overrides["model_path"] = model
            actions.append(Node(package=spec.package, executable=spec.executable, name=spec.name,
                                parameters=[str(params_file(stack)), overrides], output="screen"))
        return actions

    state_publisher = Node(package="robot_state_publisher", executable="robot_state_publisher",
                           parameters=[{"robot_description": robot.robot_description()}],
                           remappings=[("joint_states", "/joint_states")])
    rviz = Node(package="rviz2", executable="rviz2", condition=IfCondition(LaunchConfiguration("rviz")),
                arguments=["-d", str(params_file(stack).parent.parent / "rviz" / "neuralactuator.rviz"),
                           "-f", robot.tf_frames.get("base", "base_link")])
    return LaunchDescription([*args, OpaqueFunction(function=nodes), state_publisher, rviz])
