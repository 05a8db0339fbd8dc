#!/usr/bin/env bash
set -e
source /opt/ros/jazzy/setup.bash
source /ws/install/setup.bash
exec "$@"
