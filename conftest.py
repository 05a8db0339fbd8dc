"""Workspace-wide pytest setup: a private ROS_DOMAIN_ID per run, loopback-only DDS, process hygiene,
and the NAD data location (tests that need real data skip with a reason when it is absent).
Shared helpers live in tests/na_testing.py (``from na_testing import wait_until``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "tests"))

from na_testing import ProcessGroup, nad_root  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # One DDS domain per test run (0..101 are valid on Linux with default ports), on loopback only,
    # so parallel runs on one machine and other ROS systems on the network never see each other.
    if "NA_TEST_DOMAIN_FIXED" not in os.environ:
        os.environ["ROS_DOMAIN_ID"] = str(1 + os.getpid() % 100)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def nad_dir() -> Path:
    root = nad_root()
    if root is None:
        pytest.skip("NAD data not found: set NAD_DIR or place the NAD files in ../shared/nad")
    return root


@pytest.fixture
def processes() -> Iterator[ProcessGroup]:
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.close()
