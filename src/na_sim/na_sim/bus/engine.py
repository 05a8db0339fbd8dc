"""Protocol-independent core of an emulated servo bus: servos, their control tables, live telemetry.

A ``BusEngine`` turns request packets into reply packets (pure Python, no I/O), so the protocols
are testable without a pty; ``BusEmulator`` (emulator.py) moves the bytes. Register addresses,
sizes, unit scales and power-up values all come from the robot table.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field

from na_description.robot_table import RobotTable
from na_sim.bus.backend import ArmBackend, ServoState
from na_sim.bus.control_table import ControlTable

LOG = logging.getLogger("na_sim.bus")


@dataclass
class Request:
    """One instruction packet as the servos decoded it."""

    servo_id: int
    instruction: int
    params: bytes
    checksum_ok: bool = True


@dataclass
class Reply:
    """One status packet on the wire, from the servo(s) that produced it."""

    servo_ids: tuple[int, ...]
    data: bytes
    return_delay_s: float = 0.0  # the servo's Return Delay Time (used when wire timing is emulated)


@dataclass
class EmulatedServo:
    servo_id: int
    joint: int
    table: ControlTable
    registered_write: tuple[int, bytes] | None = None  # REG_WRITE waiting for ACTION
    last_state: ServoState | None = None


@dataclass
class PendingEffects:
    """Writes of one packet that the backend must see (applied once, after the whole packet)."""

    goal_joints: set[int] = field(default_factory=set)
    torque_joints: set[int] = field(default_factory=set)
    id_changed: bool = False


class BusEngine(ABC):
    """Servos of one robot on one bus, answering instruction packets from the host."""

    #: registers whose value comes from the backend; a read touching them refreshes the snapshot
    LIVE_REGISTERS: tuple[str, ...] = ()
    #: register ranges the host may not write (names)
    READ_ONLY_REGISTERS: tuple[str, ...] = ()

    def __init__(self, robot: RobotTable, backend: ArmBackend, initial_torque: bool = False) -> None:
        if not robot.bus.ids:
            raise ValueError(f"robot {robot.name} has no servo bus to emulate")
        states = backend.servo_states()
        if len(states) != robot.n_joints:
            raise ValueError(
                f"backend reports {len(states)} servo states but {robot.name} has {robot.n_joints} joints"
            )
        self.robot = robot
        self.bus = robot.bus
        self.backend = backend
        self.units = robot.bus.units
        self._bad_state_logged: set[tuple[int, str]] = set()
        self.bad_states = 0  # telemetry values that were NaN/inf and kept their previous register value
        #: the host's baud rate (set by the emulator from the pty); a servo only hears a host at its own
        #: Baud_Rate. None = unknown: every servo hears.
        self.line_baud: int | None = None
        self._baud_codes = {int(k): int(v) for k, v in robot.bus.extra.get("baud_rate_codes", {}).items()}
        size = self.table_size()
        self.servos: dict[int, EmulatedServo] = {}
        for joint, servo_id in enumerate(robot.bus.ids):
            table = ControlTable(size, robot.bus.registers)
            self.servos[servo_id] = EmulatedServo(servo_id, joint, table)
            self.power_up(self.servos[servo_id], initial_torque)
        self._live_span = self._span(self.LIVE_REGISTERS)
        for servo in self.servos.values():
            self.encode_state(servo, states[servo.joint])
        self._fresh = False
        for servo in self.servos.values():
            backend.set_torque_enabled(servo.joint, initial_torque)

    # ----------------------------------------------------------------- protocol (subclasses)
    @abstractmethod
    def extract(self, buffer: bytearray) -> tuple[int, Request | None]:
        """Find the next instruction packet in ``buffer``.

        Returns (bytes to remove from the front, the packet or None). (0, None) = wait for more bytes.
        """

    @abstractmethod
    def handle(self, request: Request) -> list[Reply]:
        """Execute one instruction; the status packets to send, in bus order."""

    @abstractmethod
    def encode_state(self, servo: EmulatedServo, state: ServoState) -> None:
        """Write one servo's telemetry into its control table, in register counts."""

    @abstractmethod
    def decode_goal(self, servo: EmulatedServo) -> float:
        """Goal_Position register -> joint angle in rad."""

    @abstractmethod
    def check_write(self, servo: EmulatedServo, address: int, data: bytes) -> int:
        """Protocol error code for writing ``data`` at ``address`` (0 = allowed)."""

    def table_size(self) -> int:
        return max(r.address + r.size for r in self.bus.registers.values())

    def return_delay_s(self, servo: EmulatedServo) -> float:
        """Return Delay Time register is in 2 us units on both families."""
        if servo.table.has("return_delay_time"):
            return 2e-6 * servo.table.get("return_delay_time")
        return 0.0

    # ----------------------------------------------------------------- shared behaviour
    def power_up(self, servo: EmulatedServo, initial_torque: bool) -> None:
        """Fill the control table with the power-up values of the robot table."""
        table = servo.table
        values = {**self.bus.extra.get("power_up", {}), **self.bus.defaults}
        for name, value in values.items():
            if table.has(name):
                table.set(name, int(value))
        table.set("model_number", self.bus.model_number)
        table.set("id", servo.servo_id)
        table.set("torque_enable", 1 if initial_torque else 0)

    def servo_baud(self, servo: EmulatedServo) -> int | None:
        """The servo's bit rate from its Baud_Rate register (None when the table has no code map)."""
        if not self._baud_codes or not servo.table.has("baud_rate"):
            return None
        return self._baud_codes.get(servo.table.get("baud_rate"), -1)

    def hears(self, servo: EmulatedServo) -> bool:
        """At another baud rate a servo sees only framing errors and stays silent."""
        if self.line_baud is None:
            return True
        baud = self.servo_baud(servo)
        return baud is None or baud == self.line_baud

    def servo(self, servo_id: int) -> EmulatedServo | None:
        """The servo with this id, if it is on the bus and hears the host."""
        servo = self.servos.get(servo_id)
        return servo if servo is not None and self.hears(servo) else None

    def reachable(self) -> list[EmulatedServo]:
        """Servos that hear the host (all of them at the right baud rate), in id order."""
        return [self.servos[i] for i in sorted(self.servos) if self.hears(self.servos[i])]

    def begin_packet(self) -> None:
        """A new instruction: the next status packet or live read takes a fresh backend snapshot."""
        self._fresh = False

    def ensure_fresh(self) -> None:
        """One backend snapshot per instruction packet: every servo samples the same instant."""
        if getattr(self, "_fresh", False):
            return
        states = self.backend.servo_states()
        for servo in self.servos.values():
            self.encode_state(servo, states[servo.joint])
        self._fresh = True

    def refresh(self, address: int, length: int) -> None:
        """Take the packet's snapshot if a read of [address, address+length) touches live registers."""
        lo, hi = self._live_span
        if address < hi and lo < address + length:
            self.ensure_fresh()

    def finite(self, servo: EmulatedServo, name: str, value: float) -> bool:
        """NaN/inf telemetry keeps the register's previous value (a real servo never reports NaN)."""
        if math.isfinite(value):
            return True
        self.bad_states += 1
        key = (servo.servo_id, name)
        if key not in self._bad_state_logged:
            self._bad_state_logged.add(key)
            LOG.warning("servo %d: backend reported %s=%r; keeping the previous register value",
                        servo.servo_id, name, value)
        return False

    def write(self, servo: EmulatedServo, address: int, data: bytes, effects: PendingEffects) -> int:
        """Validated write into one servo's table; records what the backend must be told."""
        error = self.check_write(servo, address, data)
        if error:
            return error
        servo.table.write(address, data)
        self.note_effects(servo, address, len(data), effects)
        return 0

    def note_effects(self, servo: EmulatedServo, address: int, length: int, effects: PendingEffects) -> None:
        table = servo.table
        if table.overlaps("goal_position", address, length):
            effects.goal_joints.add(servo.joint)
        if table.overlaps("torque_enable", address, length):
            effects.torque_joints.add(servo.joint)
        if table.overlaps("id", address, length):
            effects.id_changed = True

    def commit(self, effects: PendingEffects) -> None:
        """Tell the backend about the goal/torque writes of one packet, in one call each."""
        by_joint = {s.joint: s for s in self.servos.values()}
        for joint in sorted(effects.torque_joints):
            self.backend.set_torque_enabled(joint, by_joint[joint].table.get("torque_enable") != 0)
        if effects.goal_joints:
            goals = {j: self.decode_goal(by_joint[j]) for j in sorted(effects.goal_joints)}
            self.backend.set_goal_positions(goals)
        if effects.id_changed:
            self.servos = {s.table.get("id"): s for s in self.servos.values()}
            for servo_id, servo in self.servos.items():
                servo.servo_id = servo_id

    def read_only(self, servo: EmulatedServo, address: int, length: int) -> bool:
        return any(servo.table.overlaps(name, address, length) for name in self.READ_ONLY_REGISTERS)

    def _span(self, names: Iterable[str]) -> tuple[int, int]:
        regs = [self.bus.registers[n] for n in names if n in self.bus.registers]
        if not regs:
            return (0, 0)
        return (min(r.address for r in regs), max(r.address + r.size for r in regs))
