"""na-sim-bench runs end to end (emulator in a child process, real SDKs) and accounts bytes right."""

from __future__ import annotations

import json
from pathlib import Path

from na_description.robot_table import load_robot
from na_sim.bench import main


def expected_sync_read_bytes(robot: str, fast: bool = False) -> int:
    """Wire bytes of one sync-read cycle, from the two protocols' packet layouts."""
    bus = load_robot(robot).bus
    n, length = len(bus.ids), bus.telemetry_length
    if bus.family == "dynamixel":
        request = 14 + n  # header(4) id len(2) inst addr(2) len(2) ids crc(2)
        reply = 8 + n * (length + 4) if fast else n * (11 + length)
        return request + reply
    return (8 + n) + n * (6 + length)  # FF FF id len inst addr len ids chk; FF FF id len err data chk


def test_bench_reports_every_cycle_without_failures(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    assert main(["--seconds", "0.3", "--no-physics", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cycles/s" in printed
    results = json.loads(out.read_text())["bus"]
    assert [(r["robot"], r["mode"]) for r in results] == [
        ("so101", "sync_read"), ("omx", "sync_read"), ("omx", "fast_sync_read")]
    for r in results:
        assert r["cycles"] > 10 and r["failures"] == 0
        assert r["bytes_per_cycle"] == expected_sync_read_bytes(r["robot"], r["mode"] == "fast_sync_read")
    so101 = results[0]
    assert abs(1000.0 / so101["wire_ms"] - 714) < 1  # the 1 Mbps ceiling of architecture.md
