"""Dynamixel Protocol 2.0 servos (XM430-W350 control table from the robot table).

Packet: FF FF FD 00 | ID | LEN_L LEN_H | INST | params | CRC_L CRC_H, LEN = params + 3, CRC-16
(polynomial 0x8005, no reflection, init 0) over everything before it, computed after byte stuffing
(FF FF FD -> FF FF FD FD inside INST..params). Status packets carry INST 0x55 and an error byte:
bit 7 = hardware alert (Hardware Error Status != 0), bits 0-6 = the error number of the instruction.
"""

from __future__ import annotations

import math
import time

from na_sim.bus.backend import ServoState
from na_sim.bus.control_table import (
    from_twos_complement,
    saturate_unsigned,
    to_twos_complement,
)
from na_sim.bus.engine import BusEngine, EmulatedServo, PendingEffects, Reply, Request

HEADER = b"\xff\xff\xfd\x00"
BROADCAST_ID = 0xFE
MAX_PACKET = 1024  # longer LEN fields are garbage

INST_PING = 0x01
INST_READ = 0x02
INST_WRITE = 0x03
INST_REG_WRITE = 0x04
INST_ACTION = 0x05
INST_REBOOT = 0x08
INST_STATUS = 0x55
INST_SYNC_READ = 0x82
INST_SYNC_WRITE = 0x83
INST_FAST_SYNC_READ = 0x8A
INST_BULK_READ = 0x92
INST_BULK_WRITE = 0x93
INST_FAST_BULK_READ = 0x9A

ERR_RESULT_FAIL = 1
ERR_INSTRUCTION = 2
ERR_CRC = 3
ERR_DATA_RANGE = 4
ERR_DATA_LENGTH = 5
ERR_DATA_LIMIT = 6
ERR_ACCESS = 7
ALERT_BIT = 0x80


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC_TABLE = _crc_table()


def crc16(data: bytes | bytearray) -> int:
    """CRC-16 of Protocol 2.0 (IBM polynomial 0x8005, MSB first, initial value 0)."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) ^ _CRC_TABLE[((crc >> 8) ^ byte) & 0xFF]) & 0xFFFF
    return crc


def stuff(body: bytes) -> bytes:
    """Byte stuffing of INST..params: every FF FF FD gets an extra FD so it cannot look like a header."""
    out = bytearray()
    for byte in body:
        out.append(byte)
        if byte == 0xFD and len(out) >= 3 and out[-3] == 0xFF and out[-2] == 0xFF:
            out.append(0xFD)
    return bytes(out)


def unstuff(body: bytes) -> bytes:
    out = bytearray()
    i = 0
    while i < len(body):
        out.append(body[i])
        if body[i] == 0xFD and len(out) >= 3 and out[-3] == 0xFF and out[-2] == 0xFF \
                and i + 1 < len(body) and body[i + 1] == 0xFD:
            i += 1  # skip the stuffed FD
        i += 1
    return bytes(out)


def build_packet(servo_id: int, instruction: int, params: bytes, stuffing: bool = True) -> bytes:
    """A complete packet (header, length, CRC) from unstuffed INST + params."""
    body = bytes([instruction]) + params
    if stuffing:
        body = stuff(body)
    length = len(body) + 2
    packet = HEADER + bytes([servo_id, length & 0xFF, length >> 8]) + body
    crc = crc16(packet)
    return packet + bytes([crc & 0xFF, crc >> 8])


class DynamixelEngine(BusEngine):
    """XM430-style servos speaking Protocol 2.0."""

    LIVE_REGISTERS = (
        "hardware_error_status", "realtime_tick", "moving", "moving_status", "present_pwm",
        "present_current", "present_velocity", "present_position", "velocity_trajectory",
        "position_trajectory", "present_input_voltage", "present_temperature",
    )
    READ_ONLY_REGISTERS = (
        "model_number", "firmware_version", "hardware_error_status", "realtime_tick", "moving",
        "moving_status", "present_pwm", "present_current", "present_velocity", "present_position",
        "velocity_trajectory", "position_trajectory", "present_input_voltage", "present_temperature",
    )

    def __init__(self, robot, backend, initial_torque: bool = False) -> None:
        regs = robot.bus.registers
        self.indirect_count = int(robot.bus.extra.get("indirect_count", 0))
        self._indirect_address = regs["indirect_address_1"].address if self.indirect_count else 0
        self._indirect_data = regs["indirect_data_1"].address if self.indirect_count else 0
        self._tick0 = time.monotonic()
        self._steps_per_rad = robot.bus.units["position_steps_per_rev"] / (2 * math.pi)
        super().__init__(robot, backend, initial_torque)
        if self.indirect_count:
            self._live_span = (self._live_span[0], max(self._live_span[1], self._indirect_data + self.indirect_count))

    def table_size(self) -> int:
        size = super().table_size()
        if self.indirect_count:
            size = max(size, self._indirect_data + self.indirect_count)
        return size

    def power_up(self, servo: EmulatedServo, initial_torque: bool) -> None:
        super().power_up(servo, initial_torque)
        for k in range(self.indirect_count):  # e-Manual default: Indirect Address n -> Indirect Data n
            servo.table.write(self._indirect_address + 2 * k, (self._indirect_data + k).to_bytes(2, "little"))

    # ----------------------------------------------------------------- packets
    def extract(self, buffer: bytearray) -> tuple[int, Request | None]:
        start = buffer.find(HEADER)
        if start < 0:
            keep = 3 if buffer.endswith(b"\xff\xff\xfd") else 2 if buffer.endswith(b"\xff\xff") else \
                1 if buffer.endswith(b"\xff") else 0
            return (len(buffer) - keep, None)
        if start > 0:
            return (start, None)
        if len(buffer) < 7:
            return (0, None)
        length = buffer[5] | (buffer[6] << 8)
        if length < 3 or length > MAX_PACKET:
            return (1, None)
        total = 7 + length
        if len(buffer) < total:
            return (0, None)
        packet = bytes(buffer[:total])
        crc_ok = crc16(packet[:-2]) == (packet[-2] | (packet[-1] << 8))
        body = unstuff(packet[7:-2])
        return (total, Request(packet[4], body[0], body[1:], crc_ok))

    def status(self, servo: EmulatedServo, error: int, params: bytes = b"") -> Reply:
        self.ensure_fresh()  # the alert bit reflects the servo's hardware state now
        alert = ALERT_BIT if servo.table.get("hardware_error_status") else 0
        return Reply((servo.servo_id,), build_packet(servo.servo_id, INST_STATUS, bytes([error | alert]) + params),
                     self.return_delay_s(servo))

    def _answers(self, servo: EmulatedServo, instruction: int) -> bool:
        """Status Return Level: 0 = ping only, 1 = ping + read, 2 = all instructions."""
        level = servo.table.get("status_return_level") if servo.table.has("status_return_level") else 2
        if instruction == INST_PING:
            return True
        if instruction in (INST_READ, INST_SYNC_READ, INST_FAST_SYNC_READ, INST_BULK_READ, INST_FAST_BULK_READ):
            return level >= 1
        return level >= 2

    def handle(self, request: Request) -> list[Reply]:
        sid, inst, params = request.servo_id, request.instruction, request.params
        if sid == BROADCAST_ID:
            targets = self.reachable()
        else:
            target = self.servo(sid)
            targets = [target] if target is not None else []
        if not targets:
            return []
        if not request.checksum_ok:
            return [] if sid == BROADCAST_ID else [self.status(targets[0], ERR_CRC)]
        self.begin_packet()
        effects = PendingEffects()
        try:
            replies = self._dispatch(sid, inst, params, targets, effects)
        finally:
            self.commit(effects)
        return replies

    def _dispatch(self, sid: int, inst: int, params: bytes, targets: list[EmulatedServo],
                  effects: PendingEffects) -> list[Reply]:
        if inst == INST_PING:
            return [self.status(s, 0, self.bus.model_number.to_bytes(2, "little")
                                + bytes([s.table.get("firmware_version")])) for s in targets]
        if inst in (INST_SYNC_READ, INST_FAST_SYNC_READ, INST_SYNC_WRITE, INST_BULK_READ,
                    INST_FAST_BULK_READ, INST_BULK_WRITE):
            if sid != BROADCAST_ID:
                return [self.status(targets[0], ERR_INSTRUCTION)]
            return self._group(inst, params, effects)
        if inst == INST_ACTION:
            replies = []
            for servo in targets:
                if servo.registered_write is not None:
                    address, data = servo.registered_write
                    servo.registered_write = None
                    self.write(servo, address, data, effects)
                if sid != BROADCAST_ID and self._answers(servo, inst):
                    replies.append(self.status(servo, 0))
            return replies
        if sid == BROADCAST_ID and inst in (INST_READ,):
            return []
        replies = []
        for servo in targets:
            reply = self._unicast(servo, inst, params, effects)
            if sid != BROADCAST_ID and reply is not None and self._answers(servo, inst):
                replies.append(reply)
        return replies

    def _unicast(self, servo: EmulatedServo, inst: int, params: bytes, effects: PendingEffects) -> Reply | None:
        if inst == INST_READ:
            if len(params) != 4:
                return self.status(servo, ERR_DATA_LENGTH)
            address, length = int.from_bytes(params[:2], "little"), int.from_bytes(params[2:], "little")
            error, data = self.read(servo, address, length, refresh=True)
            return self.status(servo, error, data)
        if inst in (INST_WRITE, INST_REG_WRITE):
            if len(params) < 3:
                return self.status(servo, ERR_DATA_LENGTH)
            address, data = int.from_bytes(params[:2], "little"), params[2:]
            if inst == INST_REG_WRITE:
                error = self.check_write(servo, address, data)
                if not error:
                    servo.registered_write = (address, data)
                return self.status(servo, error)
            return self.status(servo, self.write_mapped(servo, address, data, effects))
        if inst == INST_REBOOT:
            servo.table.set("torque_enable", 0)
            effects.torque_joints.add(servo.joint)
            return self.status(servo, 0)
        return self.status(servo, ERR_INSTRUCTION)

    def _group(self, inst: int, params: bytes, effects: PendingEffects) -> list[Reply]:
        if inst in (INST_SYNC_READ, INST_FAST_SYNC_READ, INST_SYNC_WRITE):
            if len(params) < 4:
                return []
            address, length = int.from_bytes(params[:2], "little"), int.from_bytes(params[2:4], "little")
            rest = params[4:]
            if inst == INST_SYNC_WRITE:
                step = 1 + length
                for k in range(0, len(rest) - step + 1, step):
                    servo = self.servo(rest[k])
                    if servo is not None:
                        self.write_mapped(servo, address, rest[k + 1 : k + step], effects)
                return []
            plan = [(self.servo(i), address, length) for i in rest]
        elif inst in (INST_BULK_READ, INST_FAST_BULK_READ):
            plan = []
            for k in range(0, len(params) - 4, 5):
                plan.append((self.servo(params[k]), int.from_bytes(params[k + 1 : k + 3], "little"),
                             int.from_bytes(params[k + 3 : k + 5], "little")))
        else:  # bulk write: [id, addr(2), len(2), data...]...
            k = 0
            while k + 5 <= len(params):
                servo = self.servo(params[k])
                address = int.from_bytes(params[k + 1 : k + 3], "little")
                length = int.from_bytes(params[k + 3 : k + 5], "little")
                if servo is not None:
                    self.write_mapped(servo, address, params[k + 5 : k + 5 + length], effects)
                k += 5 + length
            return []
        present = [(s, a, n) for s, a, n in plan if s is not None and self._answers(s, inst)]
        if present:
            self.ensure_fresh()
        if inst in (INST_FAST_SYNC_READ, INST_FAST_BULK_READ):
            return self._fast_reply([(s, *self.read(s, a, n, refresh=False)) for s, a, n in present])
        replies = []
        for servo, address, length in present:
            error, data = self.read(servo, address, length, refresh=False)
            replies.append(self.status(servo, error, data))
        return replies

    def _fast_reply(self, parts: list[tuple[EmulatedServo, int, bytes]]) -> list[Reply]:
        """One status packet from the broadcast id: [ERR ID DATA CRC] per servo, the last CRC is the packet's.

        Each servo appends its block and the CRC of the packet so far; the SDK parses it unstuffed.
        """
        if not parts:
            return []
        length = 1 + sum(4 + len(data) for _, _, data in parts)
        packet = bytearray(HEADER + bytes([BROADCAST_ID, length & 0xFF, length >> 8, INST_STATUS]))
        for servo, error, data in parts:
            alert = ALERT_BIT if servo.table.get("hardware_error_status") else 0
            packet += bytes([error | alert, servo.servo_id]) + data
            crc = crc16(packet)
            packet += bytes([crc & 0xFF, crc >> 8])
        ids = tuple(s.servo_id for s, _, _ in parts)
        return [Reply(ids, bytes(packet), self.return_delay_s(parts[0][0]))]

    # ----------------------------------------------------------------- memory
    def _in_indirect(self, address: int) -> bool:
        return self.indirect_count > 0 and self._indirect_data <= address < self._indirect_data + self.indirect_count

    def _target(self, servo: EmulatedServo, address: int) -> int:
        k = address - self._indirect_data
        return int.from_bytes(servo.table.read(self._indirect_address + 2 * k, 2), "little")

    def read(self, servo: EmulatedServo, address: int, length: int, refresh: bool) -> tuple[int, bytes]:
        if length == 0 or address + length > servo.table.size:
            return ERR_DATA_RANGE, b""
        if refresh:
            self.refresh(address, length)
        self._update_tick(servo)
        if not any(self._in_indirect(a) for a in range(address, address + length)):
            return 0, servo.table.read(address, length)
        out = bytearray()
        for a in range(address, address + length):
            target = self._target(servo, a) if self._in_indirect(a) else a
            out += servo.table.read(target, 1) if target < servo.table.size else b"\x00"
        return 0, bytes(out)

    def write_mapped(self, servo: EmulatedServo, address: int, data: bytes, effects: PendingEffects) -> int:
        """A write that may go through the indirect data area to the addresses it points at."""
        if not any(self._in_indirect(a) for a in range(address, address + len(data))):
            return self.write(servo, address, data, effects)
        writes = []
        for offset, byte in enumerate(data):
            a = address + offset
            target = self._target(servo, a) if self._in_indirect(a) else a
            if target >= servo.table.size or self.read_only(servo, target, 1) or self._in_indirect(target):
                return ERR_ACCESS
            if target < self.bus.eeprom_end and servo.table.get("torque_enable"):
                return ERR_ACCESS
            writes.append((target, byte))
        for target, byte in writes:
            servo.table.write(target, bytes([byte]))
            self.note_effects(servo, target, 1, effects)
        return 0

    def check_write(self, servo: EmulatedServo, address: int, data: bytes) -> int:
        table = servo.table
        if not data or address + len(data) > table.size:
            return ERR_DATA_RANGE
        if self.read_only(servo, address, len(data)):
            return ERR_ACCESS
        torque_on = table.get("torque_enable") != 0
        protected_while_on = address < self.bus.eeprom_end or (
            self.indirect_count and address < self._indirect_address + 2 * self.indirect_count
            and address + len(data) > self._indirect_address)
        if torque_on and protected_while_on:
            return ERR_ACCESS  # EEPROM (and indirect addresses) are locked while torque is on
        for reg in table.registers.values():  # a register must be written whole
            inside = reg.address < address + len(data) and address < reg.address + reg.size
            if inside and (reg.address < address or reg.address + reg.size > address + len(data)):
                return ERR_DATA_LENGTH
        if table.overlaps("goal_position", address, len(data)) and table.get("operating_mode") == 3:
            goal_reg = table.registers["goal_position"]
            raw = int.from_bytes(data[goal_reg.address - address : goal_reg.address - address + 4], "little")
            goal = from_twos_complement(raw, 4)
            lo = from_twos_complement(table.get("min_position_limit"), 4)
            hi = from_twos_complement(table.get("max_position_limit"), 4)
            if not lo <= goal <= hi:
                return ERR_DATA_LIMIT
        return 0

    def _update_tick(self, servo: EmulatedServo) -> None:
        if servo.table.has("realtime_tick"):
            servo.table.set("realtime_tick", int((time.monotonic() - self._tick0) * 1000) % 32768)

    # ----------------------------------------------------------------- units
    def encode_state(self, servo: EmulatedServo, state: ServoState) -> None:
        table, units = servo.table, self.units
        homing = from_twos_complement(table.get("homing_offset"), 4)
        if self.finite(servo, "position", state.position):
            raw = round(units["position_center"] + state.position * self._steps_per_rad) + homing
            table.set("present_position", to_twos_complement(raw, 4))
        if self.finite(servo, "velocity", state.velocity):
            rpm = state.velocity * 60.0 / (2 * math.pi)
            table.set("present_velocity", to_twos_complement(round(rpm / units["velocity_rpm_per_count"]), 4))
        if self.finite(servo, "load", state.load):
            table.set("present_pwm", to_twos_complement(round(state.load * units["pwm_full_scale"]), 2))
        if self.finite(servo, "current", state.current):
            table.set("present_current", to_twos_complement(round(state.current / units["current_a_per_count"]), 2))
        if self.finite(servo, "voltage", state.voltage):
            table.set("present_input_voltage",
                      saturate_unsigned(round(state.voltage / units["voltage_v_per_count"]), 2))
        if self.finite(servo, "temperature", state.temperature):
            table.set("present_temperature",
                      saturate_unsigned(round(state.temperature / units["temperature_c_per_count"]), 1))
        table.set("moving", 1 if state.moving else 0)
        if table.has("moving_status"):
            table.set("moving_status", 0 if state.moving else 1)  # bit 0: in position
        table.set("hardware_error_status", int(state.hardware_error) & 0xFF)
        if table.has("position_trajectory"):
            table.set("position_trajectory", table.get("goal_position"))
            table.set("velocity_trajectory", 0)
        servo.last_state = state

    def decode_goal(self, servo: EmulatedServo) -> float:
        table = servo.table
        raw = from_twos_complement(table.get("goal_position"), 4) - from_twos_complement(table.get("homing_offset"), 4)
        return (raw - self.units["position_center"]) / self._steps_per_rad
