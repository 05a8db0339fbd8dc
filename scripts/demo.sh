#!/usr/bin/env bash
# make demo: the SO-101 stack (driver + inference node, via na-bringup) against a simulated arm behind
# an emulated Feetech bus: a pick-and-place with a 300 g payload and one push at the gripper, ~20 s.
# Prints one status line per second; writes results/demo/force.png and summary.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$((1 + $$ % 100))}"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
if [ ! -f models/so101.onnx ] && [ -z "${NA_DEMO_MODEL:-}" ]; then
  echo "demo: models/so101.onnx is missing (train and export one: na-train, na-export; see models/README.md)" >&2
  exit 1
fi
exec python -m na_bringup.demo --out results/demo ${NA_DEMO_MODEL:+--model "$NA_DEMO_MODEL"}
