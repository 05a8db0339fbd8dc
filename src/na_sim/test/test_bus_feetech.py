"""The real scservo_sdk against the emulated SO-101 bus (6 x Feetech STS3215)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest
import scservo_sdk as scs

from na_description.robot_table import load_robot
from na_sim.bus import BusEmulator, StaticBackend, make_emulator
from na_sim.bus.feetech import checksum

SO101 = load_robot("so101")
REG = SO101.bus.registers
UNITS = SO101.bus.units
SIGN = SO101.bus.sign_bits
IDS = SO101.bus.ids
BLOCK = (SO101.bus.telemetry_start, SO101.bus.telemetry_length)
STEPS_PER_RAD = UNITS["position_steps_per_rev"] / (2 * math.pi)
CENTER = UNITS["position_steps_per_rev"] / 2


def random_backend(seed: int) -> StaticBackend:
    rng = random.Random(seed)
    backend = StaticBackend(SO101.n_joints)
    for j in range(SO101.n_joints):
        backend.set_state(j, position=rng.uniform(SO101.position_min[j], SO101.position_max[j]),
                          velocity=rng.uniform(-5, 5), load=rng.uniform(-1, 1), current=rng.uniform(-1.5, 1.5),
                          voltage=rng.uniform(11, 12.6), temperature=rng.uniform(25, 60))
    return backend


SDK_LATENCY_TIMER_MS = 50  # packet timeout 102 ms instead of 34 ms (see patient_sdk)

@pytest.fixture(autouse=True)
def patient_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDKs time a reply out after 2 x LATENCY_TIMER + 2 ms (34 ms). On a loaded shared CI machine
    the emulator thread can be descheduled that long; a longer latency timer (the same knob as the
    USB adapter's) keeps such delays from failing protocol tests. Fault tests exceed it on purpose."""
    monkeypatch.setattr(scs.port_handler, "LATENCY_TIMER", SDK_LATENCY_TIMER_MS)


class Session:
    def __init__(self, emulator: BusEmulator, backend: StaticBackend) -> None:
        self.emulator, self.backend = emulator, backend
        self.port = scs.PortHandler(emulator.path)
        assert self.port.openPort()
        self.ph = scs.PacketHandler(SO101.bus.extra["protocol_end"])

    def close(self) -> None:
        self.port.closePort()


@pytest.fixture
def bus() -> Iterator[Session]:
    backend = random_backend(11)
    emulator = make_emulator("so101", backend)
    emulator.start()
    session = Session(emulator, backend)
    try:
        yield session
    finally:
        session.close()
        emulator.stop()


def decode_block(data_of, servo_id: int) -> dict[str, float]:
    """Telemetry block -> SI units, from the STS3215 memory table and nad-format.md (not the emulator code)."""
    def reg(name: str, sign: str | None = None) -> int:
        value = data_of(servo_id, REG[name].address, REG[name].size)
        return scs.SCS_TOHOST(value, SIGN[sign]) if sign else value
    return {
        "position": (reg("present_position", "position") - CENTER) / STEPS_PER_RAD,
        "velocity": reg("present_velocity", "velocity") * UNITS["velocity_step_per_s"] / STEPS_PER_RAD,
        "load": reg("present_load", "load") / UNITS["load_full_scale"],
        "current": reg("present_current", "current") * UNITS["current_a_per_count"],
        "voltage": reg("present_voltage") * UNITS["voltage_v_per_count"],
        "temperature": reg("present_temperature") * UNITS["temperature_c_per_count"],
    }


ONE_COUNT = {
    "position": 1 / STEPS_PER_RAD, "velocity": UNITS["velocity_step_per_s"] / STEPS_PER_RAD,
    "load": 1 / UNITS["load_full_scale"], "current": UNITS["current_a_per_count"],
    "voltage": UNITS["voltage_v_per_count"], "temperature": UNITS["temperature_c_per_count"],
}


def test_ping_reports_model_number_and_absent_ids_time_out(bus: Session) -> None:
    for servo_id in IDS:
        assert bus.ph.ping(bus.port, servo_id) == (SO101.bus.model_number, scs.COMM_SUCCESS, 0)
    assert bus.ph.ping(bus.port, 42)[1] == scs.COMM_RX_TIMEOUT


def test_sync_read_of_the_telemetry_block_matches_the_backend(bus: Session) -> None:
    group = scs.GroupSyncRead(bus.port, bus.ph, *BLOCK)
    for servo_id in IDS:
        assert group.addParam(servo_id)
    signs = set()
    for seed in (1, 2, 3, 4):  # live registers: every cycle reads the backend's current state
        for joint, state in enumerate(random_backend(seed).servo_states()):
            bus.backend.set_state(joint, **vars(state))
        assert group.txRxPacket() == scs.COMM_SUCCESS
        states = bus.backend.servo_states()
        for joint, servo_id in enumerate(IDS):
            for name, value in decode_block(group.getData, servo_id).items():
                expected = getattr(states[joint], name)
                assert abs(value - expected) <= ONE_COUNT[name], (servo_id, name, value, expected)
                signs.add((name, value < 0))
    assert ("load", True) in signs and ("velocity", True) in signs  # sign-magnitude was exercised


def test_sync_write_of_goals_reaches_the_backend(bus: Session) -> None:
    goal = REG["goal_position"]
    goals = [SO101.position_min[j] + 0.61 * (SO101.position_max[j] - SO101.position_min[j])
             for j in range(SO101.n_joints)]
    group = scs.GroupSyncWrite(bus.port, bus.ph, goal.address, goal.size)
    for servo_id, q in zip(IDS, goals):
        counts = round(CENTER + q * STEPS_PER_RAD)
        assert group.addParam(servo_id, [scs.SCS_LOBYTE(counts), scs.SCS_HIBYTE(counts)])
    assert group.txPacket() == scs.COMM_SUCCESS
    readback, result, _ = bus.ph.read2ByteTxRx(bus.port, IDS[-1], goal.address)
    assert (readback, result) == (round(CENTER + goals[-1] * STEPS_PER_RAD), scs.COMM_SUCCESS)
    assert bus.backend.goal_writes == 1
    for joint, q in enumerate(goals):
        assert bus.backend.goals[joint] == pytest.approx(q, abs=ONE_COUNT["position"])
    for joint, state in enumerate(bus.backend.servo_states()):  # StaticBackend: goal -> position at once
        assert state.position == pytest.approx(goals[joint], abs=ONE_COUNT["position"])


def test_torque_enable_reaches_the_backend(bus: Session) -> None:
    torque = REG["torque_enable"]
    assert bus.backend.torque_enabled == [False] * SO101.n_joints
    assert bus.ph.write1ByteTxRx(bus.port, IDS[4], torque.address, 1) == (scs.COMM_SUCCESS, 0)
    assert bus.backend.torque_enabled[4] is True


def test_homing_offset_needs_lock_zero_and_shifts_present_position(bus: Session) -> None:
    lock, homing, present = REG["lock"], REG["homing_offset"], REG["present_position"]
    servo_id = IDS[1]
    before = scs.SCS_TOHOST(bus.ph.read2ByteTxRx(bus.port, servo_id, present.address)[0], SIGN["position"])
    assert bus.ph.write1ByteTxRx(bus.port, servo_id, lock.address, 1) == (scs.COMM_SUCCESS, 0)
    offset = scs.SCS_TOSCS(-300, SIGN["homing_offset"])  # negative: bit 11 sign-magnitude
    assert bus.ph.write2ByteTxRx(bus.port, servo_id, homing.address, offset)[0] == scs.COMM_SUCCESS
    assert bus.ph.read2ByteTxRx(bus.port, servo_id, homing.address)[0] == 0  # locked: EEPROM unchanged
    assert bus.ph.write1ByteTxRx(bus.port, servo_id, lock.address, 0) == (scs.COMM_SUCCESS, 0)
    assert bus.ph.write2ByteTxRx(bus.port, servo_id, homing.address, offset) == (scs.COMM_SUCCESS, 0)
    assert bus.ph.read2ByteTxRx(bus.port, servo_id, homing.address)[0] == offset
    after = scs.SCS_TOHOST(bus.ph.read2ByteTxRx(bus.port, servo_id, present.address)[0], SIGN["position"])
    assert after - before == 300  # Present_Position = raw - Homing_Offset
    # the goal is decoded in the same frame: writing Present_Position back as the goal holds the joint
    q = bus.backend.servo_states()[1].position
    goal = REG["goal_position"]
    assert bus.ph.write2ByteTxRx(bus.port, servo_id, goal.address, scs.SCS_TOSCS(after, SIGN["position"]))[0] == 0
    assert bus.backend.goals[1] == pytest.approx(q, abs=ONE_COUNT["position"])


def test_read_only_registers_ignore_writes(bus: Session) -> None:
    present = REG["present_position"]
    before = bus.ph.read2ByteTxRx(bus.port, IDS[0], present.address)[0]
    assert bus.ph.write2ByteTxRx(bus.port, IDS[0], present.address, 1234)[0] == scs.COMM_SUCCESS
    assert bus.ph.read2ByteTxRx(bus.port, IDS[0], present.address)[0] == before


def test_hardware_error_bits_in_status_packets(bus: Session) -> None:
    bus.backend.set_state(3, hardware_error=scs.ERRBIT_OVERHEAT)
    _, result, error = bus.ph.ping(bus.port, IDS[3])
    assert result == scs.COMM_SUCCESS and error == scs.ERRBIT_OVERHEAT
    assert bus.ph.read1ByteTxRx(bus.port, IDS[3], REG["status"].address)[0] == error


def test_reg_write_waits_for_action(bus: Session) -> None:
    goal = REG["goal_position"]
    assert bus.ph.regWriteTxRx(bus.port, IDS[0], goal.address, 2, [0x00, 0x09]) == (scs.COMM_SUCCESS, 0)
    assert bus.backend.goals[0] is None
    assert bus.ph.action(bus.port, scs.BROADCAST_ID) == scs.COMM_SUCCESS
    assert bus.ph.ping(bus.port, IDS[0])[1] == scs.COMM_SUCCESS
    assert bus.backend.goals[0] == pytest.approx((0x900 - CENTER) / STEPS_PER_RAD)


def test_goal_is_clamped_to_the_position_limits(bus: Session) -> None:
    goal, max_limit = REG["goal_position"], REG["max_position_limit"]
    assert bus.ph.write2ByteTxRx(bus.port, IDS[2], max_limit.address, 3000) == (scs.COMM_SUCCESS, 0)
    assert bus.ph.write2ByteTxRx(bus.port, IDS[2], goal.address, 3500) == (scs.COMM_SUCCESS, 0)
    assert bus.ph.read2ByteTxRx(bus.port, IDS[2], goal.address)[0] == 3000
    assert bus.backend.goals[2] == pytest.approx((3000 - CENTER) / STEPS_PER_RAD)


def test_checksum_matches_the_sdk(bus: Session) -> None:
    packet = [0xFF, 0xFF, 3, 4, 2, 56, 15, 0]
    bus.ph.txPacket(bus.port, packet)  # the SDK fills in its checksum
    bus.port.is_using = False
    assert packet[-1] == checksum(bytes(packet[2:-1]))


def test_changing_an_id_keeps_the_joint(bus: Session) -> None:
    assert bus.ph.write1ByteTxRx(bus.port, IDS[5], REG["id"].address, 33) == (scs.COMM_SUCCESS, 0)
    assert bus.ph.ping(bus.port, IDS[5])[1] == scs.COMM_RX_TIMEOUT
    assert bus.ph.ping(bus.port, 33)[1] == scs.COMM_SUCCESS
    assert bus.ph.write2ByteTxRx(bus.port, 33, REG["goal_position"].address, 2048) == (scs.COMM_SUCCESS, 0)
    assert bus.backend.goals[5] == pytest.approx(0.0)


def test_a_bad_instruction_checksum_gets_no_reply(bus: Session) -> None:
    packet = [0xFF, 0xFF, IDS[0], 2, 0x01, 0]
    packet[-1] = checksum(bytes(packet[2:-1])) ^ 0xFF
    bus.port.writePort(bytes(packet))
    assert bus.ph.ping(bus.port, IDS[0])[1] == scs.COMM_SUCCESS  # the next good packet is answered
    assert bus.emulator.stats.malformed >= 1
    assert bus.emulator.stats.replies == 2  # the ping and its model-number read, nothing for the bad one
