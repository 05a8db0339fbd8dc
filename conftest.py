"""Workspace-wide pytest setup: a private ROS_DOMAIN_ID per run, loopback-only DDS, process hygiene,
and the NAD data location (tests that need real data skip with a reason when it is absent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    # One DDS domain per test run (0..101 are valid on Linux with default ports), on loopback only,
    # so parallel runs on one machine and other ROS systems on the network never see each other.
    if "NA_TEST_DOMAIN_FIXED" not in os.environ:
        os.environ["ROS_DOMAIN_ID"] = str(1 + os.getpid() % 100)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    os.environ.setdefault("MPLBACKEND", "Agg")


def nad_root() -> Path | None:
    """The NAD data folder: $NAD_DIR, else ../shared/nad beside the repository."""
    candidate = Path(os.environ.get("NAD_DIR", REPO.parent / "shared" / "nad"))
    return candidate if (candidate / "so101").is_dir() else None


@pytest.fixture
def nad_dir() -> Path:
    root = nad_root()
    if root is None:
        pytest.skip("NAD data not found: set NAD_DIR or place the NAD files in ../shared/nad")
    return root


class ProcessGroup:
    """Starts helper processes and ends every one of them, by PID, when the test ends."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.STDOUT)
        kwargs.setdefault("text", True)
        proc = subprocess.Popen(args, start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def python(self, code_or_module: list[str], **kwargs) -> subprocess.Popen:
        return self.start([sys.executable, *code_or_module], **kwargs)

    def stop(self, proc: subprocess.Popen, timeout: float = 10.0) -> int:
        """SIGINT (clean ROS shutdown), then SIGTERM, then SIGKILL; returns the exit code."""
        if proc.poll() is None:
            for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        return proc.wait()

    def close(self) -> None:
        for proc in self.procs:
            self.stop(proc, timeout=5.0)


@pytest.fixture
def processes() -> Iterator[ProcessGroup]:
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.close()


def wait_until(predicate, timeout: float, interval: float = 0.01, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
