"""Fixtures for the na_driver tests: a ROS probe participant in the test process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def ros_probe():
    from ros_probe import RosProbe

    probe = RosProbe()
    try:
        yield probe
    finally:
        probe.close()
