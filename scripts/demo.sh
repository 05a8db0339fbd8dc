#!/usr/bin/env bash
# make demo (foundation stage): the full simulated stack arrives with na_bringup. Until then this
# shows the smallest real thing: the robot tables, and a na_msgs/ActuatorState sent from one process
# and received by another over Fast DDS on a private domain.
set -euo pipefail
cd "$(dirname "$0")/.."
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$((1 + $$ % 100))}"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
python - <<'PY'
from na_description.robot_table import load_robot, robot_names
for name in robot_names():
    r = load_robot(name)
    print(f"robot {name:6s} {r.display_name:22s} joints={','.join(r.joint_names)}")
PY
python tests/msg_publisher.py ActuatorState /na_demo/actuator_states &
pub=$!
trap 'kill -INT $pub 2>/dev/null; wait $pub 2>/dev/null || true' EXIT
python - <<'PY'
import time
import rclpy
from rclpy.node import Node
from na_msgs.msg import ActuatorState
rclpy.init()
node = Node("na_demo_listener")
got = []
node.create_subscription(ActuatorState, "/na_demo/actuator_states", got.append, 10)
t0 = time.monotonic()
while not got and time.monotonic() - t0 < 30:
    rclpy.spin_once(node, timeout_sec=0.1)
if not got:
    raise SystemExit("demo: no ActuatorState received within 30 s")
m = got[0]
print(f"received ActuatorState from another process after {time.monotonic() - t0:.2f} s:")
for i, n in enumerate(m.name):
    print(f"  {n:14s} pos={m.position[i]:+.3f} rad load={m.load[i]:+.2f} V={m.voltage[i]:.1f} T={m.temperature[i]:.0f}C")
print("demo (foundation stage): messages and DDS work; the simulated arm + force estimate come with na_bringup.")
node.destroy_node()
rclpy.shutdown()
PY
