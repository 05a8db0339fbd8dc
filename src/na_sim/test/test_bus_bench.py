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


def rx_timeout_text(robot: str) -> str:
    """The SDK's text for a reply that did not come within its packet timeout (~34 ms)."""
    if load_robot(robot).bus.family == "dynamixel":
        import dynamixel_sdk as sdk

        return sdk.PacketHandler(2.0).getTxRxResult(sdk.COMM_RX_TIMEOUT)
    import scservo_sdk as sdk

    return sdk.PacketHandler(0).getTxRxResult(sdk.COMM_RX_TIMEOUT)


def test_bench_reports_every_cycle_without_protocol_faults(tmp_path: Path, capsys) -> None:
    """Every cycle either parses or, rarely, times out: a host that preempts the emulator's process
    beyond the SDK's packet timeout is scheduling, not a protocol fault. A corrupt or short reply,
    or a request the emulator could not parse, fails the test."""
    out = tmp_path / "bench.json"
    assert main(["--seconds", "0.3", "--no-physics", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cycles/s" in printed
    results = json.loads(out.read_text())["bus"]
    assert [(r["robot"], r["mode"]) for r in results] == [
        ("so101", "sync_read"), ("omx", "sync_read"), ("omx", "fast_sync_read")]
    for r in results:
        assert r["cycles"] > 10
        assert r["malformed"] == 0
        codes = r["failure_codes"]
        assert set(codes) <= {rx_timeout_text(r["robot"])}, codes
        assert r["failures"] == sum(codes.values()) <= max(1, r["cycles"] // 100), codes
        assert r["bytes_per_cycle"] == expected_sync_read_bytes(r["robot"], r["mode"] == "fast_sync_read")
    so101 = results[0]
    assert abs(1000.0 / so101["wire_ms"] - 714) < 1  # the 1 Mbps ceiling of architecture.md
