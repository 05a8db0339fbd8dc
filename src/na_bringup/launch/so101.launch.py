"""ros2 launch na_bringup so101.launch.py [sim:=true] [port:=...] [model:=...] [rate:=...] [rviz:=true]"""

from na_bringup.launch_common import robot_launch_description


def generate_launch_description():
    return robot_launch_description("so101")
