"""Fault injection seen through the real SDKs: dropped, corrupted, late and echoed replies, garbage on
the line, and an adapter that is unplugged and plugged back in at the same path."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dynamixel_sdk as dxl
import pytest
import scservo_sdk as scs

from na_description.robot_table import load_robot
from na_sim.bus import BusEmulator, FaultSpec, StaticBackend, make_emulator

SDK_LATENCY_TIMER_MS = 50  # packet timeout 102 ms instead of 34 ms (see patient_sdk)

@pytest.fixture(autouse=True)
def patient_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDKs time a reply out after 2 x LATENCY_TIMER + 2 ms (34 ms). On a loaded shared CI machine
    the emulator thread can be descheduled that long; a longer latency timer (the same knob as the
    USB adapter's) keeps such delays from failing protocol tests. Fault tests exceed it on purpose."""
    monkeypatch.setattr(dxl.port_handler, "LATENCY_TIMER", SDK_LATENCY_TIMER_MS)
    monkeypatch.setattr(scs.port_handler, "LATENCY_TIMER", SDK_LATENCY_TIMER_MS)



def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)

@dataclass
class Family:
    robot: str
    sdk: object
    protocol: float | int

    @property
    def table(self):
        return load_robot(self.robot)


FAMILIES = [Family("omx", dxl, 2.0), Family("so101", scs, 0)]


class Bus:
    """An emulator plus an SDK session, with the few calls the tests need for either family."""

    def __init__(self, family: Family, emulator: BusEmulator, backend: StaticBackend) -> None:
        self.family, self.emulator, self.backend = family, emulator, backend
        self.sdk = family.sdk
        self.table = family.table
        self.ids = self.table.bus.ids
        self.port = self.sdk.PortHandler(emulator.path)
        assert self.port.openPort()
        self.ph = self.sdk.PacketHandler(family.protocol)

    def ping(self, servo_id: int) -> int:
        return self.ph.ping(self.port, servo_id)[1]

    def read_temperature(self, servo_id: int) -> tuple[int, int]:
        reg = self.table.bus.registers["present_temperature"]
        value, result, _ = self.ph.read1ByteTxRx(self.port, servo_id, reg.address)
        return value, result

    def sync_read(self) -> int:
        group = self.sdk.GroupSyncRead(self.port, self.ph, self.table.bus.telemetry_start,
                                       self.table.bus.telemetry_length)
        for servo_id in self.ids:
            group.addParam(servo_id)
        return group.txRxPacket()


@pytest.fixture(params=FAMILIES, ids=[f.robot for f in FAMILIES])
def bus(request) -> Iterator[Bus]:
    family: Family = request.param
    backend = StaticBackend(family.table.n_joints, temperature=41.0)
    emulator = make_emulator(family.robot, backend)
    emulator.start()
    session = Bus(family, emulator, backend)
    try:
        yield session
    finally:
        session.port.closePort()
        emulator.stop()


def test_dropped_reply_times_out_and_the_next_transaction_succeeds(bus: Bus) -> None:
    bus.emulator.set_faults(FaultSpec(drop=1.0))
    assert bus.ping(bus.ids[0]) == bus.sdk.COMM_RX_TIMEOUT
    assert bus.sync_read() == bus.sdk.COMM_RX_TIMEOUT
    bus.emulator.set_faults(None)
    assert bus.ping(bus.ids[0]) == bus.sdk.COMM_SUCCESS
    assert bus.sync_read() == bus.sdk.COMM_SUCCESS
    assert bus.emulator.stats.dropped == 1 + len(bus.ids)


def test_one_silent_servo_fails_the_sync_read(bus: Bus) -> None:
    bus.emulator.set_faults(FaultSpec(drop=1.0, ids=frozenset({bus.ids[2]})))
    assert bus.sync_read() == bus.sdk.COMM_RX_TIMEOUT
    assert bus.ping(bus.ids[1]) == bus.sdk.COMM_SUCCESS  # the others still answer
    bus.emulator.set_faults(None)
    assert bus.sync_read() == bus.sdk.COMM_SUCCESS


def test_corrupted_checksum_is_rx_corrupt_and_the_next_transaction_succeeds(bus: Bus) -> None:
    bus.emulator.set_faults(FaultSpec(corrupt=1.0))
    assert bus.read_temperature(bus.ids[1])[1] == bus.sdk.COMM_RX_CORRUPT
    assert bus.sync_read() == bus.sdk.COMM_RX_CORRUPT  # the SDK stops at the first bad reply
    wait_until(lambda: bus.emulator.stats.corrupted == 1 + len(bus.ids), 2.0, what="all corrupted replies")
    bus.emulator.set_faults(None)
    bus.port.ser.reset_input_buffer()  # the rest of the corrupted sync-read replies is still queued
    assert bus.read_temperature(bus.ids[1]) == (41, bus.sdk.COMM_SUCCESS)
    assert bus.emulator.stats.corrupted >= 2


def test_late_reply_times_out_then_the_bus_recovers(bus: Bus) -> None:
    late_ms = 4 * SDK_LATENCY_TIMER_MS
    bus.emulator.set_faults(FaultSpec(late=1.0, late_ms=late_ms))
    start = time.monotonic()
    assert bus.read_temperature(bus.ids[0])[1] == bus.sdk.COMM_RX_TIMEOUT
    assert time.monotonic() - start < late_ms / 1000  # the SDK gave up before the reply came
    bus.emulator.set_faults(None)
    wait_until(lambda: bus.emulator.stats.replies == 1, 2.0, what="the late reply")
    if bus.sdk is dxl:  # dynamixel_sdk's clearPort() empties the input before every instruction
        assert bus.read_temperature(bus.ids[0]) == (41, dxl.COMM_SUCCESS)
    else:  # scservo_sdk's clearPort() only flushes output: the stale reply is taken for the new one
        bus.backend.set_state(0, temperature=55.0)
        assert bus.read_temperature(bus.ids[0]) == (41, scs.COMM_SUCCESS)  # stale!
        bus.port.ser.reset_input_buffer()  # what a Feetech driver must do after a timeout
        assert bus.read_temperature(bus.ids[0]) == (55, scs.COMM_SUCCESS)


def test_echoing_adapter(bus: Bus) -> None:
    bus.emulator.set_faults(FaultSpec(echo=True))
    assert bus.sync_read() == bus.sdk.COMM_SUCCESS  # the broadcast echo is skipped by both SDKs
    if bus.sdk is dxl:  # Protocol 2.0 status packets carry INST 0x55: an echoed instruction is skipped
        assert bus.read_temperature(bus.ids[0]) == (41, dxl.COMM_SUCCESS)
        assert bus.ping(bus.ids[0]) == dxl.COMM_SUCCESS
    else:  # scservo_sdk takes the echo of a unicast read for the status packet: INST_READ as error
        reg = bus.table.bus.registers["present_temperature"]
        data, result, error = bus.ph.readTxRx(bus.port, bus.ids[0], reg.address, 1)
        assert (result, error, data) == (scs.COMM_SUCCESS, scs.INST_READ, [reg.address])
    assert bus.emulator.stats.echoed_bytes > 0


def test_seeded_faults_are_reproducible(bus: Bus) -> None:
    def run() -> list[int]:
        bus.emulator.set_faults(FaultSpec.parse("drop=0.3,corrupt=0.2,seed=5"))
        results = []
        for _ in range(12):
            results.append(bus.ping(bus.ids[0]))
            bus.port.ser.reset_input_buffer()
        return results
    first, second = run(), run()
    assert first == second
    assert {bus.sdk.COMM_SUCCESS, bus.sdk.COMM_RX_TIMEOUT} <= set(first)


def test_garbage_on_the_line_is_skipped(bus: Bus) -> None:
    bus.port.writePort(bytes([0xFF, 0x00, 0x13, 0xFF, 0xFF]))  # noise and a torn header
    time.sleep(0.05)  # longer than the emulator's resync timeout
    assert bus.ping(bus.ids[-1]) == bus.sdk.COMM_SUCCESS
    assert bus.emulator.stats.malformed > 0


def test_vanish_and_reappear_at_the_same_link(tmp_path: Path) -> None:
    link = tmp_path / "ttyNA0"
    backend = StaticBackend(5)
    emulator = make_emulator("omx", backend, link=str(link))
    threads_before = threading.active_count()
    fds_before = len(os.listdir("/proc/self/fd"))
    assert emulator.start() == str(link) and link.is_symlink()
    first_pty = os.readlink(link)
    port = dxl.PortHandler(str(link))
    assert port.openPort()
    ph = dxl.PacketHandler(2.0)
    assert ph.ping(port, 11)[1] == dxl.COMM_SUCCESS
    emulator.vanish()
    assert not link.exists()
    with pytest.raises(Exception):  # noqa: B017  the SDK surfaces the unplugged port as an OSError/termios.error
        ph.ping(port, 11)
    port.is_using = False
    with pytest.raises(Exception):  # noqa: B017  and reopening fails while the path is gone
        port.openPort()
    assert emulator.reappear() == str(link)
    assert link.is_symlink()
    assert port.openPort()
    assert ph.ping(port, 11)[1] == dxl.COMM_SUCCESS
    port.closePort()
    emulator.stop()
    assert not link.exists()
    assert threading.active_count() == threads_before
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert first_pty.startswith("/dev/")


def test_fault_spec_parsing() -> None:
    spec = FaultSpec.parse("drop=0.05, corrupt=0.02,late=0.01,echo=1,seed=3,ids=2+3")
    assert (spec.drop, spec.corrupt, spec.late, spec.echo, spec.seed, spec.ids) == (
        0.05, 0.02, 0.01, True, 3, frozenset({2, 3}))
    assert FaultSpec.parse(str(spec)) == spec
    assert FaultSpec.parse("") == FaultSpec()
    with pytest.raises(ValueError, match="bogus"):
        FaultSpec.parse("bogus=1")
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        FaultSpec.parse("drop=1.5")
    with pytest.raises(ValueError, match="bad value"):
        FaultSpec.parse("drop=lots")


def test_link_refuses_to_replace_a_real_file(tmp_path: Path) -> None:
    target = tmp_path / "not_a_link"
    target.write_text("keep me")
    emulator = make_emulator("so101", StaticBackend(6), link=str(target))
    with pytest.raises(FileExistsError):
        emulator.start()
    assert target.read_text() == "keep me"
    emulator.stop()


def test_a_host_at_another_baud_rate_is_not_heard(bus: Bus) -> None:
    table_baud = bus.table.bus.baudrate
    assert bus.port.setBaudRate(57600)
    assert bus.ping(bus.ids[0]) == bus.sdk.COMM_RX_TIMEOUT
    assert bus.emulator.stats.wrong_baud >= 1
    assert bus.port.setBaudRate(table_baud)
    assert bus.ping(bus.ids[0]) == bus.sdk.COMM_SUCCESS


def test_writing_baud_rate_moves_the_servo_to_the_new_rate(bus: Bus) -> None:
    codes = bus.table.bus.extra["baud_rate_codes"]
    new_baud = 500000 if 500000 in codes.values() else 2000000
    code = next(k for k, v in codes.items() if v == new_baud)
    servo_id = bus.ids[1]
    register = bus.table.bus.registers["baud_rate"]
    assert bus.ph.write1ByteTxRx(bus.port, servo_id, register.address, code) == (bus.sdk.COMM_SUCCESS, 0)
    assert bus.ping(servo_id) == bus.sdk.COMM_RX_TIMEOUT  # answered at the old rate, now at the new one
    assert bus.ping(bus.ids[0]) == bus.sdk.COMM_SUCCESS
    assert bus.port.setBaudRate(new_baud)
    assert bus.ping(servo_id) == bus.sdk.COMM_SUCCESS
    assert bus.ping(bus.ids[0]) == bus.sdk.COMM_RX_TIMEOUT


def test_timed_vanish_and_reappear_from_the_fault_spec(tmp_path: Path) -> None:
    link = tmp_path / "ttyTIMED"
    faults = FaultSpec.parse("vanish_after=0.2,reappear_after=0.3")
    emulator = make_emulator("so101", StaticBackend(6), faults=faults, link=str(link))
    emulator.start()
    try:
        port = scs.PortHandler(str(link))
        assert port.openPort()
        ph = scs.PacketHandler(0)
        assert ph.ping(port, 1)[1] == scs.COMM_SUCCESS
        wait_until(lambda: not link.exists(), 5.0, what="the timed unplug")
        port.closePort()
        wait_until(link.exists, 5.0, what="the timed replug")
        assert port.openPort()
        assert ph.ping(port, 1)[1] == scs.COMM_SUCCESS
        port.closePort()
    finally:
        emulator.stop()
    assert not link.exists()


def test_a_link_in_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    emulator = make_emulator("so101", StaticBackend(6), link=str(tmp_path / "no_such_dir" / "tty"))
    fds_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="cannot create the bus link"):
        emulator.start()
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert not emulator.running
