"""Feetech SCS/STS servos (STS3215 memory table from the robot table), as scservo_sdk speaks to them.

Packet: FF FF | ID | LEN | INST | params | CHK, LEN = params + 2, CHK = ~(ID + LEN + INST + params) & 0xFF.
Status packets put the servo's error bits where the instruction was (voltage 1, angle 2, overheat 4,
over-current 8, overload 32). Signed registers are sign-magnitude (the sign bits are in the robot
table: position/velocity 15, load 10, homing offset 11). Present_Position = raw encoder - Homing_Offset.
EEPROM (addresses below eeprom_end) accepts writes only while Lock = 0; other writes are ignored.
"""

from __future__ import annotations

import math

from na_sim.bus.backend import ServoState
from na_sim.bus.control_table import from_sign_magnitude, saturate_unsigned, to_sign_magnitude
from na_sim.bus.engine import BusEngine, EmulatedServo, PendingEffects, Reply, Request

BROADCAST_ID = 0xFE
INST_PING = 0x01
INST_READ = 0x02
INST_WRITE = 0x03
INST_REG_WRITE = 0x04
INST_ACTION = 0x05
INST_SYNC_READ = 0x82
INST_SYNC_WRITE = 0x83


def checksum(body: bytes | bytearray) -> int:
    """Feetech/Protocol 1.0 checksum of ID..params."""
    return ~sum(body) & 0xFF


def build_packet(servo_id: int, first: int, params: bytes) -> bytes:
    """A packet with ``first`` in the instruction (requests) or error (status) slot."""
    body = bytes([servo_id, len(params) + 2, first]) + params
    return b"\xff\xff" + body + bytes([checksum(body)])


class FeetechEngine(BusEngine):
    """STS3215-style servos on a Feetech SCS bus."""

    LIVE_REGISTERS = (
        "present_position", "present_velocity", "present_load", "present_voltage",
        "present_temperature", "status", "moving", "present_current",
    )
    READ_ONLY_REGISTERS = (
        "model_number", "present_position", "present_velocity", "present_load", "present_voltage",
        "present_temperature", "status", "moving", "present_current",
    )

    def __init__(self, robot, backend, initial_torque: bool = False) -> None:
        self._steps_per_rad = robot.bus.units["position_steps_per_rev"] / (2 * math.pi)
        self._center = robot.bus.units["position_steps_per_rev"] / 2
        self.ignored_writes = 0  # EEPROM writes refused because Lock was set, or read-only targets
        super().__init__(robot, backend, initial_torque)

    def sign_bit(self, name: str) -> int:
        return self.bus.sign_bits.get(name, 15)

    # ----------------------------------------------------------------- packets
    def extract(self, buffer: bytearray) -> tuple[int, Request | None]:
        start = buffer.find(b"\xff\xff")
        if start < 0:
            return (len(buffer) - (1 if buffer.endswith(b"\xff") else 0), None)
        if start > 0:
            return (start, None)
        if len(buffer) < 4:
            return (0, None)
        if buffer[2] == 0xFF:  # FF FF FF: the header starts one byte later
            return (1, None)
        length = buffer[3]
        if length < 2:
            return (1, None)
        total = 4 + length
        if len(buffer) < total:
            return (0, None)
        packet = bytes(buffer[:total])
        ok = checksum(packet[2:-1]) == packet[-1]
        return (total, Request(packet[2], packet[4], packet[5:-1], ok))

    def status(self, servo: EmulatedServo, params: bytes = b"") -> Reply:
        self.ensure_fresh()  # the error bits reflect the servo's state now
        error = servo.table.get("status") & 0x7F if servo.table.has("status") else 0
        return Reply((servo.servo_id,), build_packet(servo.servo_id, error, params), self.return_delay_s(servo))

    def handle(self, request: Request) -> list[Reply]:
        if not request.checksum_ok:
            return []  # the servo cannot trust a packet with a bad checksum: it stays silent
        sid, inst, params = request.servo_id, request.instruction, request.params
        self.begin_packet()
        effects = PendingEffects()
        try:
            if sid == BROADCAST_ID:
                return self._broadcast(inst, params, effects)
            servo = self.servo(sid)
            if servo is None:
                return []
            return self._unicast(servo, inst, params, effects)
        finally:
            self.commit(effects)

    def _unicast(self, servo: EmulatedServo, inst: int, params: bytes, effects: PendingEffects) -> list[Reply]:
        if inst == INST_PING:
            return [self.status(servo)]
        if inst == INST_READ:
            if len(params) != 2:
                return []
            address, length = params[0], params[1]
            if length == 0 or address + length > servo.table.size:
                return [self.status(servo, bytes(length))] if length else []
            self.refresh(address, length)
            return [self.status(servo, servo.table.read(address, length))]
        if inst in (INST_WRITE, INST_REG_WRITE):
            if len(params) < 2:
                return []
            if inst == INST_REG_WRITE:
                servo.registered_write = (params[0], params[1:])
            else:
                self.write(servo, params[0], params[1:], effects)
            return [self.status(servo)]
        if inst == INST_ACTION:
            self._action(servo, effects)
            return [self.status(servo)]
        return []

    def _broadcast(self, inst: int, params: bytes, effects: PendingEffects) -> list[Reply]:
        if inst == INST_SYNC_READ and len(params) >= 2:
            address, length = params[0], params[1]
            servos = [s for s in (self.servo(i) for i in params[2:]) if s is not None]
            if not servos or address + length > servos[0].table.size:
                return []
            self.refresh(address, length)  # one snapshot: all servos sample the same instant
            return [self.status(s, s.table.read(address, length)) for s in servos]
        if inst == INST_SYNC_WRITE and len(params) >= 2:
            address, length = params[0], params[1]
            step = 1 + length
            rest = params[2:]
            for k in range(0, len(rest) - step + 1, step):
                servo = self.servo(rest[k])
                if servo is not None:
                    self.write(servo, address, rest[k + 1 : k + step], effects)
            return []
        if inst == INST_ACTION:
            for servo in self.reachable():
                self._action(servo, effects)
        elif inst in (INST_WRITE, INST_REG_WRITE) and len(params) >= 2:
            for servo in self.reachable():
                if inst == INST_WRITE:
                    self.write(servo, params[0], params[1:], effects)
                else:
                    servo.registered_write = (params[0], params[1:])
        return []

    def _action(self, servo: EmulatedServo, effects: PendingEffects) -> None:
        if servo.registered_write is not None:
            address, data = servo.registered_write
            servo.registered_write = None
            self.write(servo, address, data, effects)

    def check_write(self, servo: EmulatedServo, address: int, data: bytes) -> int:
        table = servo.table
        refused = (
            address + len(data) > table.size
            or self.read_only(servo, address, len(data))
            or (address < self.bus.eeprom_end and table.get("lock") != 0)
        )
        if refused:
            self.ignored_writes += 1
            return 1
        return 0

    def write(self, servo: EmulatedServo, address: int, data: bytes, effects: PendingEffects) -> int:
        error = super().write(servo, address, data, effects)
        if not error and servo.table.overlaps("goal_position", address, len(data)):
            self._clamp_goal(servo)
        return error

    def _clamp_goal(self, servo: EmulatedServo) -> None:
        """The firmware limits Goal_Position to [Min, Max]_Position_Limit (both 0 = multi-turn, no limit)."""
        table = servo.table
        lo, hi = table.get("min_position_limit"), table.get("max_position_limit")
        if lo == 0 and hi == 0:
            return
        bit = self.sign_bit("position")
        homing = from_sign_magnitude(table.get("homing_offset"), self.sign_bit("homing_offset"))
        raw = from_sign_magnitude(table.get("goal_position"), bit) + homing
        clamped = min(max(raw, lo), hi)
        if clamped != raw:
            table.set("goal_position", to_sign_magnitude(clamped - homing, bit))

    # ----------------------------------------------------------------- units
    def encode_state(self, servo: EmulatedServo, state: ServoState) -> None:
        table, units = servo.table, self.units
        steps = int(units["position_steps_per_rev"])
        if self.finite(servo, "position", state.position):
            raw = round(self._center + state.position * self._steps_per_rad) % steps  # 12-bit encoder
            homing = from_sign_magnitude(table.get("homing_offset"), self.sign_bit("homing_offset"))
            table.set("present_position", to_sign_magnitude(raw - homing, self.sign_bit("position")))
        if self.finite(servo, "velocity", state.velocity):
            counts = round(state.velocity * self._steps_per_rad / units["velocity_step_per_s"])
            table.set("present_velocity", to_sign_magnitude(counts, self.sign_bit("velocity")))
        if self.finite(servo, "load", state.load):
            counts = round(state.load * units["load_full_scale"])
            table.set("present_load", to_sign_magnitude(counts, self.sign_bit("load")))
        if self.finite(servo, "current", state.current):
            counts = round(state.current / units["current_a_per_count"])
            table.set("present_current", to_sign_magnitude(counts, self.sign_bit("current")))
        if self.finite(servo, "voltage", state.voltage):
            table.set("present_voltage", saturate_unsigned(round(state.voltage / units["voltage_v_per_count"]), 1))
        if self.finite(servo, "temperature", state.temperature):
            table.set("present_temperature",
                      saturate_unsigned(round(state.temperature / units["temperature_c_per_count"]), 1))
        table.set("moving", 1 if state.moving else 0)
        table.set("status", int(state.hardware_error) & 0xFF)
        servo.last_state = state

    def decode_goal(self, servo: EmulatedServo) -> float:
        table = servo.table
        homing = from_sign_magnitude(table.get("homing_offset"), self.sign_bit("homing_offset"))
        raw = from_sign_magnitude(table.get("goal_position"), self.sign_bit("position")) + homing
        return (raw - self._center) / self._steps_per_rad
