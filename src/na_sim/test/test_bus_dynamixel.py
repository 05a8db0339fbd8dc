"""The real dynamixel_sdk against the emulated OpenManipulator-X bus (5 x XM430-W350, Protocol 2.0)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import dynamixel_sdk as dxl
import pytest

from na_description.robot_table import load_robot
from na_sim.bus import BusEmulator, StaticBackend, make_emulator
from na_sim.bus.dynamixel import build_packet, crc16, stuff, unstuff

OMX = load_robot("omx")
REG = OMX.bus.registers
UNITS = OMX.bus.units
IDS = OMX.bus.ids
BLOCK = (OMX.bus.telemetry_start, OMX.bus.telemetry_length)
STEPS_PER_RAD = UNITS["position_steps_per_rev"] / (2 * math.pi)
RAD_S_PER_COUNT = UNITS["velocity_rpm_per_count"] * 2 * math.pi / 60


def signed(value: int, size: int) -> int:
    bits = 8 * size
    return value - (1 << bits) if value & (1 << (bits - 1)) else value


def random_backend(seed: int) -> StaticBackend:
    rng = random.Random(seed)
    backend = StaticBackend(OMX.n_joints)
    for j in range(OMX.n_joints):
        backend.set_state(j, position=rng.uniform(OMX.position_min[j], OMX.position_max[j]),
                          velocity=rng.uniform(-4, 4), load=rng.uniform(-1, 1), current=rng.uniform(-2, 2),
                          voltage=rng.uniform(11, 12.6), temperature=rng.uniform(25, 60))
    return backend


SDK_LATENCY_TIMER_MS = 50  # packet timeout 102 ms instead of 34 ms (see patient_sdk)

@pytest.fixture(autouse=True)
def patient_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDKs time a reply out after 2 x LATENCY_TIMER + 2 ms (34 ms). On a loaded shared CI machine
    the emulator thread can be descheduled that long; a longer latency timer (the same knob as the
    USB adapter's) keeps such delays from failing protocol tests. Fault tests exceed it on purpose."""
    monkeypatch.setattr(dxl.port_handler, "LATENCY_TIMER", SDK_LATENCY_TIMER_MS)


class Session:
    """One open port + packet handler against a running emulator."""

    def __init__(self, emulator: BusEmulator, backend: StaticBackend) -> None:
        self.emulator, self.backend = emulator, backend
        self.port = dxl.PortHandler(emulator.path)
        assert self.port.openPort()
        self.ph = dxl.PacketHandler(2.0)

    def close(self) -> None:
        self.port.closePort()


@pytest.fixture
def bus() -> Iterator[Session]:
    backend = random_backend(7)
    emulator = make_emulator("omx", backend)
    emulator.start()
    session = Session(emulator, backend)
    try:
        yield session
    finally:
        session.close()
        emulator.stop()


def decode_block(data_of, servo_id: int) -> dict[str, float]:
    """Telemetry block of one servo -> SI units, written from the XM430 e-Manual (not the emulator code)."""
    def reg(name: str) -> int:
        return signed(data_of(servo_id, REG[name].address, REG[name].size), REG[name].size)
    return {
        "position": (reg("present_position") - UNITS["position_center"]) / STEPS_PER_RAD,
        "velocity": reg("present_velocity") * RAD_S_PER_COUNT,
        "load": reg("present_pwm") / UNITS["pwm_full_scale"],
        "current": reg("present_current") * UNITS["current_a_per_count"],
        "voltage": reg("present_input_voltage") * UNITS["voltage_v_per_count"],
        "temperature": reg("present_temperature") * UNITS["temperature_c_per_count"],
    }


ONE_COUNT = {
    "position": 1 / STEPS_PER_RAD, "velocity": RAD_S_PER_COUNT, "load": 1 / UNITS["pwm_full_scale"],
    "current": UNITS["current_a_per_count"], "voltage": UNITS["voltage_v_per_count"],
    "temperature": UNITS["temperature_c_per_count"],
}


def assert_matches_backend(decoded: dict[int, dict[str, float]], backend: StaticBackend) -> None:
    states = backend.servo_states()
    for joint, servo_id in enumerate(IDS):
        for name, value in decoded[servo_id].items():
            expected = getattr(states[joint], name)
            assert abs(value - expected) <= ONE_COUNT[name], (servo_id, name, value, expected)


def test_ping_reports_model_number_and_absent_ids_time_out(bus: Session) -> None:
    for servo_id in IDS:
        model, result, error = bus.ph.ping(bus.port, servo_id)
        assert (model, result, error) == (OMX.bus.model_number, dxl.COMM_SUCCESS, 0)
    assert bus.ph.ping(bus.port, 99)[1] == dxl.COMM_RX_TIMEOUT


@pytest.mark.parametrize("fast", [False, True], ids=["sync_read", "fast_sync_read"])
def test_sync_read_of_the_telemetry_block_matches_the_backend(bus: Session, fast: bool) -> None:
    group = dxl.GroupSyncRead(bus.port, bus.ph, *BLOCK)
    for servo_id in IDS:
        assert group.addParam(servo_id)
    for seed in (1, 2, 3):  # registers are live: a new backend state is read on the next cycle
        for joint, state in enumerate(random_backend(seed).servo_states()):
            bus.backend.set_state(joint, **vars(state))
        assert (group.fastSyncRead() if fast else group.txRxPacket()) == dxl.COMM_SUCCESS
        assert_matches_backend({i: decode_block(group.getData, i) for i in IDS}, bus.backend)


@pytest.mark.parametrize("fast", [False, True], ids=["bulk_read", "fast_bulk_read"])
def test_bulk_read_serves_a_different_range_per_servo(bus: Session, fast: bool) -> None:
    group = dxl.GroupBulkRead(bus.port, bus.ph)
    pos, temp = REG["present_position"], REG["present_temperature"]
    for k, servo_id in enumerate(IDS):
        reg = pos if k % 2 == 0 else temp
        assert group.addParam(servo_id, reg.address, reg.size)
    assert (group.fastBulkRead() if fast else group.txRxPacket()) == dxl.COMM_SUCCESS
    states = bus.backend.servo_states()
    for k, servo_id in enumerate(IDS):
        if k % 2 == 0:
            raw = signed(group.getData(servo_id, pos.address, 4), 4)
            assert abs((raw - UNITS["position_center"]) / STEPS_PER_RAD - states[k].position) <= ONE_COUNT["position"]
        else:
            assert group.getData(servo_id, temp.address, 1) == round(states[k].temperature)


def test_sync_write_of_goals_reaches_the_backend(bus: Session) -> None:
    goal = REG["goal_position"]
    goals = [OMX.position_min[j] + 0.37 * (OMX.position_max[j] - OMX.position_min[j]) for j in range(OMX.n_joints)]
    group = dxl.GroupSyncWrite(bus.port, bus.ph, goal.address, goal.size)
    for servo_id, q in zip(IDS, goals):
        counts = round(UNITS["position_center"] + q * STEPS_PER_RAD)
        assert group.addParam(servo_id, list(counts.to_bytes(4, "little", signed=True)))
    assert group.txPacket() == dxl.COMM_SUCCESS
    # the sync write has no reply; a read on the same bus is answered after it was applied
    readback, result, _ = bus.ph.read4ByteTxRx(bus.port, IDS[-1], goal.address)
    assert result == dxl.COMM_SUCCESS
    assert readback == round(UNITS["position_center"] + goals[-1] * STEPS_PER_RAD)
    assert bus.backend.goal_writes == 1  # one backend call for the whole sync write
    for joint, q in enumerate(goals):
        assert bus.backend.goals[joint] == pytest.approx(q, abs=ONE_COUNT["position"])


def test_torque_enable_and_eeprom_access_error(bus: Session) -> None:
    torque, homing = REG["torque_enable"], REG["homing_offset"]
    servo_id, joint = IDS[2], 2
    assert bus.backend.torque_enabled[joint] is False  # servos power up torque-off
    assert bus.ph.write1ByteTxRx(bus.port, servo_id, torque.address, 1) == (dxl.COMM_SUCCESS, 0)
    assert bus.backend.torque_enabled[joint] is True
    # EEPROM is locked while torque is on: Access Error (7), value unchanged
    assert bus.ph.write4ByteTxRx(bus.port, servo_id, homing.address, 100) == (dxl.COMM_SUCCESS, dxl.ERRNUM_ACCESS)
    assert bus.ph.read4ByteTxRx(bus.port, servo_id, homing.address)[0] == 0
    assert bus.ph.write1ByteTxRx(bus.port, servo_id, torque.address, 0) == (dxl.COMM_SUCCESS, 0)
    assert bus.backend.torque_enabled[joint] is False
    before = signed(bus.ph.read4ByteTxRx(bus.port, servo_id, REG["present_position"].address)[0], 4)
    assert bus.ph.write4ByteTxRx(bus.port, servo_id, homing.address, 100) == (dxl.COMM_SUCCESS, 0)
    after = signed(bus.ph.read4ByteTxRx(bus.port, servo_id, REG["present_position"].address)[0], 4)
    assert after - before == 100  # Present Position = actual + Homing Offset


def test_write_errors_read_only_partial_register_and_limit(bus: Session) -> None:
    servo_id = IDS[0]
    present, goal = REG["present_position"], REG["goal_position"]
    assert bus.ph.write4ByteTxRx(bus.port, servo_id, present.address, 5)[1] == dxl.ERRNUM_ACCESS
    assert bus.ph.write2ByteTxRx(bus.port, servo_id, goal.address, 5)[1] == dxl.ERRNUM_DATA_LENGTH
    assert bus.ph.write4ByteTxRx(bus.port, servo_id, goal.address, 5000)[1] == dxl.ERRNUM_DATA_LIMIT
    assert bus.backend.goal_writes == 0
    assert bus.ph.write4ByteTxRx(bus.port, servo_id, goal.address, 2048) == (dxl.COMM_SUCCESS, 0)
    assert bus.backend.goals[0] == pytest.approx(0.0)


def test_byte_stuffing_both_ways(bus: Session) -> None:
    """Values whose bytes read FF FF FD on the wire must survive stuffing in both directions."""
    pwm, current, profile = REG["present_pwm"], REG["present_current"], REG["profile_velocity"]
    assert pwm.address + 2 == current.address
    # present_pwm = -1 (FF FF), present_current = 253 (FD 00): the reply data contain FF FF FD
    bus.backend.set_state(0, load=-1 / UNITS["pwm_full_scale"], current=253 * UNITS["current_a_per_count"])
    data, result, error = bus.ph.readTxRx(bus.port, IDS[0], pwm.address, 4)
    assert (result, error, bytes(data)) == (dxl.COMM_SUCCESS, 0, b"\xff\xff\xfd\x00")
    value = int.from_bytes(b"\xff\xff\xfd\x00", "little")  # host -> servo: the SDK stuffs the write
    assert bus.ph.write4ByteTxRx(bus.port, IDS[1], profile.address, value) == (dxl.COMM_SUCCESS, 0)
    assert bus.ph.read4ByteTxRx(bus.port, IDS[1], profile.address)[0] == value


def test_crc_and_stuffing_agree_with_the_sdk() -> None:
    ph = dxl.PacketHandler(2.0)
    rng = random.Random(3)
    for _ in range(50):
        data = bytes(rng.choice([0xFF, 0xFD, 0x00, rng.randrange(256)]) for _ in range(rng.randrange(1, 40)))
        assert crc16(data) == ph.updateCRC(0, list(data), len(data))
        body = b"\x03" + data  # INST + params
        packet = [0xFF, 0xFF, 0xFD, 0x00, 1, (len(body) + 2) & 0xFF, (len(body) + 2) >> 8, *body, 0, 0]
        stuffed = ph.addStuffing(packet)
        assert bytes(stuffed[7:-2]) == stuff(body)
        assert unstuff(stuff(body)) == body


def test_indirect_address_maps_present_position(bus: Session) -> None:
    servo_id = IDS[3]
    base_addr, base_data = REG["indirect_address_1"].address, REG["indirect_data_1"].address
    present = REG["present_position"]
    for k in range(present.size):
        assert bus.ph.write2ByteTxRx(bus.port, servo_id, base_addr + 2 * k, present.address + k) == (dxl.COMM_SUCCESS, 0)
    via_indirect = bus.ph.read4ByteTxRx(bus.port, servo_id, base_data)
    direct = bus.ph.read4ByteTxRx(bus.port, servo_id, present.address)
    assert via_indirect == direct and via_indirect[1] == dxl.COMM_SUCCESS


def test_reg_write_waits_for_action(bus: Session) -> None:
    goal = REG["goal_position"]
    data = list((2100).to_bytes(4, "little"))
    assert bus.ph.regWriteTxRx(bus.port, IDS[0], goal.address, goal.size, data) == (dxl.COMM_SUCCESS, 0)
    assert bus.backend.goals[0] is None
    assert bus.ph.action(bus.port, dxl.BROADCAST_ID) == dxl.COMM_SUCCESS
    assert bus.ph.ping(bus.port, IDS[0])[1] == dxl.COMM_SUCCESS  # the action is processed before this
    assert bus.backend.goals[0] == pytest.approx((2100 - UNITS["position_center"]) / STEPS_PER_RAD)


def test_hardware_error_sets_the_alert_bit(bus: Session) -> None:
    bus.backend.set_state(1, hardware_error=0x20)  # overload
    status = REG["hardware_error_status"]
    value, result, error = bus.ph.read1ByteTxRx(bus.port, IDS[1], status.address)
    assert (value, result) == (0x20, dxl.COMM_SUCCESS)
    assert error & dxl.ERRBIT_ALERT


def test_nan_telemetry_keeps_the_last_register_value(bus: Session) -> None:
    present = REG["present_position"]
    before = bus.ph.read4ByteTxRx(bus.port, IDS[0], present.address)
    bus.backend.set_state(0, position=float("nan"))
    assert bus.ph.read4ByteTxRx(bus.port, IDS[0], present.address) == before
    assert bus.emulator.engine.bad_states >= 1


def test_a_robot_without_a_servo_bus_is_refused() -> None:
    with pytest.raises(ValueError, match="panda"):
        make_emulator("panda", StaticBackend(load_robot("panda").n_joints))
    with pytest.raises(ValueError, match="4 servo states"):
        make_emulator("omx", StaticBackend(4))


def test_status_return_level_zero_answers_only_pings(bus: Session) -> None:
    level = REG["status_return_level"]
    # the new level already applies to the status packet of the write that sets it
    assert bus.ph.write1ByteTxRx(bus.port, IDS[0], level.address, 0)[0] == dxl.COMM_RX_TIMEOUT
    assert bus.ph.write1ByteTxRx(bus.port, IDS[0], REG["led"].address, 1)[0] == dxl.COMM_RX_TIMEOUT
    assert bus.ph.read1ByteTxRx(bus.port, IDS[0], REG["led"].address)[1] == dxl.COMM_RX_TIMEOUT
    assert bus.ph.ping(bus.port, IDS[0])[1] == dxl.COMM_SUCCESS


def test_changing_an_id_keeps_the_joint(bus: Session) -> None:
    assert bus.ph.write1ByteTxRx(bus.port, IDS[4], REG["id"].address, 42) == (dxl.COMM_SUCCESS, 0)
    assert bus.ph.ping(bus.port, IDS[4])[1] == dxl.COMM_RX_TIMEOUT
    assert bus.ph.ping(bus.port, 42)[1] == dxl.COMM_SUCCESS
    assert bus.ph.write4ByteTxRx(bus.port, 42, REG["goal_position"].address, 2048) == (dxl.COMM_SUCCESS, 0)
    assert bus.backend.goals[4] == pytest.approx(0.0)


def test_engine_answers_a_bad_instruction_crc_with_a_crc_error() -> None:
    """Pure protocol engine (no pty): a corrupted instruction is answered with error 3, garbage skipped."""
    emulator = make_emulator("omx", StaticBackend(OMX.n_joints))
    engine = emulator.engine
    packet = bytearray(build_packet(IDS[0], 0x01, b""))  # ping
    packet[-1] ^= 0xFF
    buffer = bytearray(b"\x00\x13\xff") + packet
    consumed, request = engine.extract(buffer)
    assert (consumed, request) == (3, None)  # noise before the header
    del buffer[:consumed]
    consumed, request = engine.extract(buffer)
    assert consumed == len(packet) and request is not None and not request.checksum_ok
    (reply,) = engine.handle(request)
    assert reply.data[8] == dxl.ERRNUM_CRC and crc16(reply.data[:-2]) == int.from_bytes(reply.data[-2:], "little")
