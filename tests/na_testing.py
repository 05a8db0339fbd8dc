"""Test helpers shared by every package's tests (import as ``from na_testing import ...``; the root
conftest.py puts this folder on sys.path). Plain functions and classes only; fixtures are in conftest.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# ``na-sim-dataset`` as a command line that needs no installed console script (append its arguments).
NA_SIM_DATASET = [sys.executable, "-c", "from na_sim.cli import dataset_main; raise SystemExit(dataset_main())"]


def nad_root() -> Path | None:
    """The NAD data folder: $NAD_DIR, else ../shared/nad beside the repository."""
    candidate = Path(os.environ.get("NAD_DIR", REPO.parent / "shared" / "nad"))
    return candidate if (candidate / "so101").is_dir() else None


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


def wait_until(predicate, timeout: float, interval: float = 0.01, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
