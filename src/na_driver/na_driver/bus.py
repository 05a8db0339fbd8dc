"""Servo buses over the official SDKs: Feetech STS3215 (scservo_sdk) and Dynamixel XM430 (dynamixel_sdk).

Pure Python, no ROS. Everything robot-specific (ids, register map, unit scales, sign bits, baud rate)
comes from the robot table. Per cycle a bus does ONE sync read of the whole telemetry block for all
servos and ONE sync write of the goals, and converts counts to SI units.

The SDKs have traps that would let a driver publish stale data as fresh; each has a guard here:
- stale replies after a timeout: a reply that arrives after the SDK gave up is read as the answer
  to the NEXT request. The port flushes its input before every request (the Feetech SDK's
  clearPort only flushes output) and, after any failed transaction, waits until the line has been
  silent for ``quiet_s`` before the next one.
- echoing adapters (half-duplex adapters that loop the request back): detected at connect (the
  first request's bytes come back verbatim) and then the echo of every request is consumed and
  checked before the SDK reads the reply.
- sync read keeping old values after a failure: the SDK's GroupSyncRead keeps the previous
  cycle's bytes for servos it did not hear from (the Feetech isAvailable even ignores the
  result). Each read clears the buffers first and accepts only servos whose fresh bytes arrived;
  a cycle missing any servo raises BusReadError instead of returning a sample.
The SDKs busy-poll the port; the port here blocks in select() until bytes or the SDK's packet
deadline arrive, which keeps CPU per cycle low without changing the SDK's timing.
"""

from __future__ import annotations

import contextlib
import math
import select
import termios
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import dynamixel_sdk as dxl
import numpy as np
import scservo_sdk as scs
import serial

from na_description.robot_table import RobotTable
from na_driver.calibration import Calibration, default_calibration

MAX_BLOCK_S = 0.005          # longest single select() wait inside a read (the SDK re-checks its deadline)
ECHO_TIMEOUT_S = 0.02        # how long to wait for an adapter's echo of a request
TORQUE_RETRIES = 3


class BusError(RuntimeError):
    """A bus transaction failed."""


class BusReadError(BusError):
    """A telemetry read did not return fresh data from every servo; nothing from it may be used."""


class BusWriteError(BusError):
    """A goal or register write was not sent/acknowledged."""


class BusDisconnectedError(BusError):
    """The serial adapter is gone (unplugged) or cannot be opened."""


@dataclass
class TelemetrySample:
    """One bus cycle of telemetry, SI units, robot-table joint order."""

    stamp_ns: int                # wall-clock time (time.time_ns) when the replies were complete
    position: np.ndarray         # rad
    velocity: np.ndarray         # rad/s
    load: np.ndarray             # signed duty fraction -1..1
    current: np.ndarray          # A
    voltage: np.ndarray          # V
    temperature: np.ndarray      # deg C
    hardware_error: np.ndarray   # uint8 servo error/status bits
    moving: np.ndarray           # bool


@dataclass
class BusStats:
    """Counters a driver reports on /diagnostics."""

    reads_ok: int = 0
    reads_failed: int = 0
    writes_failed: int = 0
    disconnects: int = 0
    connects: int = 0
    echo_mismatches: int = 0
    bytes_discarded: int = 0
    stale_rejected: int = 0      # reads discarded because more replies followed them (late replies)
    servo_errors: dict[int, int] = field(default_factory=dict)   # servo id -> failed reads blamed on it
    last_error: str = ""


class _GuardedPortMixin:
    """Mixed in front of an SDK PortHandler: input flush, echo handling, blocking reads, quiesce."""

    ser: serial.Serial
    packet_timeout: float

    def _guard_init(self, echo: bool | None) -> None:
        self.echo = echo                 # None = detect on the next request
        self.pending = bytearray()       # bytes read while probing for an echo, served first
        self.echo_mismatches = 0

    def clearPort(self) -> None:  # noqa: N802 (SDK method name)
        self.pending.clear()
        self.ser.reset_input_buffer()

    def writePort(self, packet) -> int:  # noqa: N802 (SDK method name)
        data = bytes(packet)
        written = self.ser.write(data)
        if self.echo is False:
            return written
        back = self._read_exactly(len(data), ECHO_TIMEOUT_S)
        if self.echo is None:            # probing: an echo is the request verbatim, a reply never is
            if back == data:
                self.echo = True
            else:
                self.echo = False
                self.pending.extend(back)
            return written
        if back != data:                 # expected our echo and got something else: the request is void
            self.echo_mismatches += 1
            self.pending.clear()
            return 0
        return written

    def readPort(self, length: int) -> bytes:  # noqa: N802 (SDK method name)
        if self.pending:
            out = bytes(self.pending[:length])
            del self.pending[:length]
            return out
        remaining_s = (self.packet_timeout - self.getTimeSinceStart()) / 1000.0
        if remaining_s > 0:
            select.select([self.ser.fd], [], [], min(remaining_s, MAX_BLOCK_S))
        return self.ser.read(length)

    def _read_exactly(self, length: int, timeout_s: float) -> bytes:
        out = bytearray()
        deadline = time.monotonic() + timeout_s
        while len(out) < length:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([self.ser.fd], [], [], left)
            if ready:
                out.extend(self.ser.read(length - len(out)))
        return bytes(out)

    def quiesce(self, quiet_s: float, max_s: float) -> int:
        """Discard input until the line was silent for ``quiet_s`` (at most ``max_s``); returns bytes dropped."""
        self.pending.clear()
        dropped = 0
        start = last_rx = time.monotonic()
        while True:
            now = time.monotonic()
            if now - last_rx >= quiet_s or now - start >= max_s:
                return dropped
            ready, _, _ = select.select([self.ser.fd], [], [], min(quiet_s - (now - last_rx), max_s - (now - start)))
            if ready:
                dropped += len(self.ser.read(4096))
                last_rx = time.monotonic()


class FeetechPort(_GuardedPortMixin, scs.PortHandler):
    def __init__(self, port_name: str, echo: bool | None) -> None:
        scs.PortHandler.__init__(self, port_name)
        self._guard_init(echo)


class DynamixelPort(_GuardedPortMixin, dxl.PortHandler):
    def __init__(self, port_name: str, echo: bool | None) -> None:
        dxl.PortHandler.__init__(self, port_name)
        self._guard_init(echo)


@dataclass(frozen=True)
class _Field:
    offset: int
    size: int
    sign_bit: int | None     # sign-magnitude bit (Feetech); None with two's complement


class ServoBus(ABC):
    """One arm's servo bus. ``read()`` returns a fresh TelemetrySample or raises; never stale data."""

    COMM_SUCCESS = 0

    def __init__(self, robot: RobotTable, port: str, baudrate: int | None = None,
                 calibration: Calibration | None = None, echo: bool | None = None,
                 quiet_s: float = 0.02, max_quiet_s: float = 0.3) -> None:
        if not robot.bus.ids:
            raise BusError(f"robot {robot.name} has no servo bus (family {robot.bus.family!r})")
        self.robot = robot
        self.port_name = port
        self.baudrate = int(baudrate or robot.bus.baudrate)
        self.calibration = calibration or default_calibration(robot)
        if len(self.calibration.joints) != robot.n_joints:
            raise BusError(f"calibration has {len(self.calibration.joints)} joints, {robot.name} has {robot.n_joints}")
        self.echo_setting = echo
        self.quiet_s = quiet_s
        self.max_quiet_s = max_quiet_s
        self.ids = robot.bus.ids
        self.stats = BusStats(servo_errors=dict.fromkeys(self.ids, 0))
        self.port = None
        self.connected = False
        self._needs_quiesce = False
        self._validate_next = False
        start = robot.bus.telemetry_start
        self.block_start, self.block_length = start, robot.bus.telemetry_length

    # --- family specifics -------------------------------------------------------------------
    @abstractmethod
    def _make_port(self, echo: bool | None): ...

    @abstractmethod
    def _make_packet_handler(self): ...

    @abstractmethod
    def _make_groups(self) -> None: ...

    @abstractmethod
    def _sync_read_block(self) -> dict[int, bytes]: ...

    @abstractmethod
    def _decode(self, blocks: dict[int, bytes], stamp_ns: int) -> TelemetrySample: ...

    @abstractmethod
    def _value(self, block: bytes, name: str) -> int:
        """Register ``name`` of one servo's telemetry block, signed in the family's encoding."""

    def _raw_registers(self, blocks: dict[int, bytes]) -> np.ndarray:
        """[len(FIELDS), servos] register values of one sync read, in FIELDS order."""
        raw = np.empty((len(self.FIELDS), len(self.ids)), dtype=np.float64)
        for j, sid in enumerate(self.ids):
            for k, name in enumerate(self.FIELDS):
                raw[k, j] = self._value(blocks[sid], name)
        return raw

    @abstractmethod
    def _encode_goal(self, joint: int, angle_rad: float) -> list[int]: ...

    def _configure(self) -> None:  # noqa: B027 (optional hook)
        """Family-specific setup after the servos answered (calibration registers, ...)."""

    # --- lifecycle ---------------------------------------------------------------------------
    def connect(self) -> None:
        """Open the port, detect an echoing adapter, check every servo's model number."""
        self.close()
        port = self._make_port(self.echo_setting)
        try:
            if not port.openPort() or not port.setBaudRate(self.baudrate):
                raise BusDisconnectedError(f"cannot open {self.port_name} at {self.baudrate} baud")
        except (OSError, serial.SerialException, termios.error) as exc:
            raise BusDisconnectedError(f"cannot open {self.port_name}: {exc}") from exc
        self.port = port
        self.ph = self._make_packet_handler()
        try:
            model_reg = self.robot.bus.register("model_number")
            for sid in self.ids:
                model = self._read_register(sid, model_reg.address, model_reg.size)
                if self.robot.bus.model_number and model != self.robot.bus.model_number:
                    raise BusError(f"servo id {sid} on {self.port_name} reports model {model}, "
                                   f"the {self.robot.name} table expects {self.robot.bus.model_number}")
            self._configure()
            self._make_groups()
        except BusError:
            self.close()
            raise
        self.connected = True
        self._needs_quiesce = False
        self._validate_next = True
        self.stats.connects += 1

    def close(self) -> None:
        if self.port is not None:
            with contextlib.suppress(OSError, serial.SerialException, termios.error, AttributeError):
                self.port.closePort()
        self.port = None
        self.connected = False

    @property
    def echo_detected(self) -> bool:
        return bool(self.port is not None and self.port.echo)

    # --- transactions ------------------------------------------------------------------------
    def _guard(self, call, what: str):
        """Run one SDK transaction; turn a vanished adapter into BusDisconnectedError."""
        if self.port is None:
            raise BusDisconnectedError(f"{self.port_name} is not connected")
        if self._needs_quiesce:
            try:
                self.stats.bytes_discarded += self.port.quiesce(self.quiet_s, self.max_quiet_s)
            except (OSError, serial.SerialException, termios.error) as exc:
                self._lost(exc)
            self._needs_quiesce = False
        try:
            return call()
        except (OSError, serial.SerialException, termios.error) as exc:
            self._lost(exc)
        finally:
            if self.port is not None:
                self.port.is_using = False

    def _lost(self, exc: Exception):
        self.stats.disconnects += 1
        self.stats.last_error = f"adapter lost: {exc}"
        self.close()
        raise BusDisconnectedError(f"{self.port_name}: {exc}") from exc

    def _failed(self, message: str, error_cls=BusError):
        self._needs_quiesce = True
        self._validate_next = True
        if self.port is not None:
            self.stats.echo_mismatches = self.port.echo_mismatches
        self.stats.last_error = message
        raise error_cls(message)

    def _read_register(self, sid: int, address: int, size: int, retries: int = TORQUE_RETRIES) -> int:
        read = {1: self.ph.read1ByteTxRx, 2: self.ph.read2ByteTxRx, 4: self.ph.read4ByteTxRx}[size]
        message = ""
        for _ in range(max(1, retries)):
            value, result, _ = self._guard(lambda: read(self.port, sid, address), f"read {address}")
            if result == self.COMM_SUCCESS:
                return int(value)
            message = f"servo id {sid}: reading register {address} failed ({self.ph.getTxRxResult(result)})"
            self._needs_quiesce = True
        self._failed(message)

    def _write_register(self, sid: int, address: int, size: int, value: int, retries: int = TORQUE_RETRIES) -> None:
        write = {1: self.ph.write1ByteTxRx, 2: self.ph.write2ByteTxRx, 4: self.ph.write4ByteTxRx}[size]
        message = ""
        for _ in range(max(1, retries)):
            result, _ = self._guard(lambda: write(self.port, sid, address, value), f"write {address}")
            if result == self.COMM_SUCCESS:
                return
            message = f"servo id {sid}: writing register {address} failed ({self.ph.getTxRxResult(result)})"
            self._needs_quiesce = True
        self.stats.writes_failed += 1
        self._failed(message, BusWriteError)

    def read(self) -> TelemetrySample:
        """One sync read of the telemetry block of all servos -> SI sample (raises, never stale)."""
        blocks = self._sync_read_block()
        stamp_ns = time.time_ns()
        missing = [sid for sid in self.ids if len(blocks.get(sid, b"")) != self.block_length]
        if missing:
            self.stats.reads_failed += 1
            # the SDK reads servos in order and stops at the first silent one: blame that one
            self.stats.servo_errors[missing[0]] += 1
            self._failed(f"no fresh telemetry from servo id(s) {missing}", BusReadError)
        if self._validate_next:
            # First read after a failure: late replies to an abandoned request may have been taken
            # for this one's. If the bus is not silent right after it, that happened: discard it.
            try:
                leftover = self.port.quiesce(self.quiet_s, self.max_quiet_s)
            except (OSError, serial.SerialException, termios.error) as exc:
                self._lost(exc)
            if leftover:
                self.stats.stale_rejected += 1
                self.stats.bytes_discarded += leftover
                self.stats.reads_failed += 1
                self._failed(f"{leftover} unexpected bytes followed the read: possibly stale replies, "
                             "sample discarded", BusReadError)
            self._validate_next = False
        self.stats.reads_ok += 1
        return self._decode(blocks, stamp_ns)

    def write_goals(self, goals_rad: Sequence[float]) -> None:
        """One sync write of goal positions (rad, robot-table order). Callers clamp; this only encodes."""
        if len(goals_rad) != len(self.ids):
            raise ValueError(f"{len(goals_rad)} goals for {len(self.ids)} servos")
        for joint, (sid, goal) in enumerate(zip(self.ids, goals_rad)):
            if not math.isfinite(goal):
                raise ValueError(f"goal for joint {self.robot.joint_names[joint]} is not finite: {goal}")
            self.goal_writer.changeParam(sid, self._encode_goal(joint, float(goal)))
        result = self._guard(self.goal_writer.txPacket, "sync write")
        if result != self.COMM_SUCCESS:
            self.stats.writes_failed += 1
            self._failed(f"goal sync write failed ({self.ph.getTxRxResult(result)})", BusWriteError)

    def set_servo_baudrate(self, baudrate: int) -> None:
        """Program every servo's Baud_Rate register (torque off first: it is EEPROM); reconnect after."""
        codes = {int(bps): int(code) for code, bps in self.robot.bus.extra.get("baud_rate_codes", {}).items()}
        if baudrate not in codes:
            raise BusError(f"{self.robot.name}: no Baud_Rate code for {baudrate} bps (known: {sorted(codes)})")
        reg = self.robot.bus.register("baud_rate")
        self.set_torque(False)
        for sid in self.ids:
            self._write_register(sid, reg.address, reg.size, codes[baudrate])

    def set_torque(self, enabled: bool) -> None:
        """Torque on/off for every servo (acknowledged writes, retried)."""
        reg = self.robot.bus.register("torque_enable")
        for sid in self.ids:
            self._write_register(sid, reg.address, reg.size, 1 if enabled else 0)

    def _fresh_group_read(self, group, txrx) -> dict[int, bytes]:
        for sid in self.ids:               # forget last cycle's bytes: only fresh replies may count
            group.data_dict[sid] = []
        result = self._guard(txrx, "sync read")
        if result != self.COMM_SUCCESS:
            # the SDK filled the servos before the failing one: those bytes are fresh but the
            # cycle is incomplete, so none of it is used
            self.stats.reads_failed += 1
            failing = next((sid for sid in self.ids if len(group.data_dict.get(sid) or []) != self.block_length),
                           self.ids[0])
            self.stats.servo_errors[failing] += 1
            self._failed(f"sync read failed at servo id {failing} ({self.ph.getTxRxResult(result)})", BusReadError)
        return {sid: bytes(group.data_dict.get(sid) or b"") for sid in self.ids}

    def _fields(self, names: Sequence[str], signed: dict[str, int]) -> dict[str, _Field]:
        out = {}
        for name in names:
            reg = self.robot.bus.register(name)
            out[name] = _Field(reg.address - self.block_start, reg.size, signed.get(name))
        return out


class FeetechBus(ServoBus):
    """Feetech STS3215 (SO-101): little-endian registers, sign-magnitude signed values."""

    FIELDS = ("present_position", "present_velocity", "present_load", "present_voltage",
              "present_temperature", "status", "moving", "present_current")

    def __init__(self, robot: RobotTable, port: str, **kwargs) -> None:
        super().__init__(robot, port, **kwargs)
        bits = robot.bus.sign_bits
        self.byteorder = "big" if int(robot.bus.extra.get("protocol_end", 0)) else "little"
        self.fields = self._fields(self.FIELDS, {
            "present_position": bits["position"], "present_velocity": bits["velocity"],
            "present_load": bits["load"], "present_current": bits["current"]})
        units = robot.bus.units
        steps = units["position_steps_per_rev"]
        self.rad_per_step = 2 * math.pi / steps
        self.velocity_scale = units["velocity_step_per_s"] * self.rad_per_step
        self.load_scale = 1.0 / units["load_full_scale"]
        self.current_scale = units["current_a_per_count"]
        self.voltage_scale = units["voltage_v_per_count"]
        self.temperature_scale = units["temperature_c_per_count"]
        self.position_bit = bits["position"]
        self.homing_bit = bits["homing_offset"]

    def _make_port(self, echo):
        return FeetechPort(self.port_name, echo)

    def _make_packet_handler(self):
        return scs.PacketHandler(int(self.robot.bus.extra.get("protocol_end", 0)))

    def _make_groups(self) -> None:
        self.telemetry_reader = scs.GroupSyncRead(self.port, self.ph, self.block_start, self.block_length)
        goal = self.robot.bus.register("goal_position")
        self.goal_writer = scs.GroupSyncWrite(self.port, self.ph, goal.address, goal.size)
        for sid in self.ids:
            self.telemetry_reader.addParam(sid)
            self.goal_writer.addParam(sid, [0] * goal.size)

    def _configure(self) -> None:
        """Program the calibration's Homing_Offset where the servo holds a different one."""
        if not self.calibration.writes_homing_offset:
            return
        homing, lock = self.robot.bus.register("homing_offset"), self.robot.bus.register("lock")
        torque = self.robot.bus.register("torque_enable")
        for sid, cal in zip(self.ids, self.calibration.joints):
            current = scs.SCS_TOHOST(self._read_register(sid, homing.address, homing.size), self.homing_bit)
            if current == cal.homing_offset:
                continue
            self._write_register(sid, torque.address, torque.size, 0)
            self._write_register(sid, lock.address, lock.size, 0)
            self._write_register(sid, homing.address, homing.size, scs.SCS_TOSCS(cal.homing_offset, self.homing_bit))
            self._write_register(sid, lock.address, lock.size, 1)
            check = scs.SCS_TOHOST(self._read_register(sid, homing.address, homing.size), self.homing_bit)
            if check != cal.homing_offset:
                raise BusError(f"servo id {sid} kept Homing_Offset {check} after writing {cal.homing_offset}")

    def _sync_read_block(self) -> dict[int, bytes]:
        return self._fresh_group_read(self.telemetry_reader, self.telemetry_reader.txRxPacket)

    def _value(self, block: bytes, name: str) -> int:
        f = self.fields[name]
        raw = int.from_bytes(block[f.offset:f.offset + f.size], self.byteorder)
        if f.sign_bit is not None and raw & (1 << f.sign_bit):
            return -(raw & ~(1 << f.sign_bit))
        return raw

    def _decode(self, blocks: dict[int, bytes], stamp_ns: int) -> TelemetrySample:
        n = len(self.ids)
        raw = self._raw_registers(blocks)
        cal = self.calibration
        position = np.array([cal.to_radians(j, raw[0, j]) for j in range(n)])
        signs = np.array([c.sign for c in cal.joints])
        return TelemetrySample(
            stamp_ns=stamp_ns, position=position,
            velocity=signs * raw[1] * self.velocity_scale,
            load=signs * raw[2] * self.load_scale,
            current=raw[7] * self.current_scale,
            voltage=raw[3] * self.voltage_scale,
            temperature=raw[4] * self.temperature_scale,
            hardware_error=raw[5].astype(np.uint8),
            moving=raw[6] != 0,
        )

    def _encode_goal(self, joint: int, angle_rad: float) -> list[int]:
        counts = scs.SCS_TOSCS(self.calibration.to_counts(joint, angle_rad), self.position_bit)
        return list(int(counts).to_bytes(2, self.byteorder))


class DynamixelBus(ServoBus):
    """Dynamixel XM430 (OMX), Protocol 2.0: little-endian, two's-complement signed values.

    One sync read per cycle covers Hardware_Error_Status and the telemetry block (present_pwm ..
    present_temperature): at connect the servos' indirect addresses are pointed at those 24 bytes
    (only when they differ and the servo's torque is off, since they are locked while it is on).
    When that is not possible (torque already on, e.g. a reconnect while the arm holds a pose), the
    plain telemetry block is read and Hardware_Error_Status is refreshed by its own small sync read
    every ``hardware_error_every`` cycles (it is a latched status, not a sample).
    """

    FIELDS = ("present_pwm", "present_current", "present_velocity", "present_position",
              "present_input_voltage", "present_temperature")
    SIGNED = frozenset({"present_pwm", "present_current", "present_velocity", "present_position"})

    def __init__(self, robot: RobotTable, port: str, fast_sync_read: bool = False,
                 hardware_error_every: int = 50, use_indirect: bool = True, **kwargs) -> None:
        super().__init__(robot, port, **kwargs)
        self.fast_sync_read = fast_sync_read
        self.use_indirect = use_indirect
        self.indirect_active = False
        self.indirect_note = "not configured"
        self.plain_start, self.plain_length = self.block_start, self.block_length
        self.hardware_error_every = max(1, int(hardware_error_every))
        self.fields = self._fields(self.FIELDS, {})
        units = robot.bus.units
        self.velocity_scale = units["velocity_rpm_per_count"] * 2 * math.pi / 60.0
        self.load_scale = 1.0 / units["pwm_full_scale"]
        self.current_scale = units["current_a_per_count"]
        self.voltage_scale = units["voltage_v_per_count"]
        self.temperature_scale = units["temperature_c_per_count"]
        self.hardware_error = np.zeros(len(self.ids), dtype=np.uint8)
        self._cycles = 0

    def _make_port(self, echo):
        return DynamixelPort(self.port_name, echo)

    def _make_packet_handler(self):
        return dxl.PacketHandler(float(self.robot.raw["bus"].get("protocol_version", 2.0)))

    def _configure(self) -> None:
        self.indirect_active = self.use_indirect and self._setup_indirect()
        bus = self.robot.bus
        if self.indirect_active:
            self.block_start, self.block_length = bus.register("indirect_data_1").address, 1 + self.plain_length
            shift = 1 - self.plain_start            # byte 0 is Hardware_Error_Status, then the telemetry block
        else:
            self.block_start, self.block_length = self.plain_start, self.plain_length
            shift = -self.plain_start
        self.fields = {name: _Field(bus.register(name).address + shift, bus.register(name).size, None)
                       for name in self.FIELDS}

    def _setup_indirect(self) -> bool:
        """Point indirect addresses 1..24 at [hardware_error_status, telemetry block]; False = not possible."""
        bus = self.robot.bus
        targets = [bus.register("hardware_error_status").address,
                   *range(self.plain_start, self.plain_start + self.plain_length)]
        if "indirect_address_1" not in bus.registers or len(targets) > int(bus.extra.get("indirect_count", 0)):
            self.indirect_note = "the robot table has no room for an indirect block"
            return False
        address = bus.register("indirect_address_1").address
        want = b"".join(t.to_bytes(2, "little") for t in targets)
        torque = bus.register("torque_enable")
        for sid in self.ids:
            if self._read_block(sid, address, len(want)) == want:
                continue
            if self._read_register(sid, torque.address, torque.size):
                self.indirect_note = f"servo id {sid} has torque on: indirect addresses locked"
                return False
            result, error = self._guard(lambda sid=sid: self.ph.writeTxRx(self.port, sid, address, len(want),
                                                                            list(want)), "indirect setup")
            # error bit 7 is the Alert flag (a hardware error is latched), not a failed write
            if result != self.COMM_SUCCESS or error & 0x7F or self._read_block(sid, address, len(want)) != want:
                self._needs_quiesce = True
                self.indirect_note = f"servo id {sid} did not take the indirect addresses"
                return False
        self.indirect_note = "hardware error + telemetry in one indirect block"
        return True

    def _read_block(self, sid: int, address: int, length: int) -> bytes | None:
        for _ in range(TORQUE_RETRIES):
            data, result, _ = self._guard(lambda: self.ph.readTxRx(self.port, sid, address, length), "read")
            if result == self.COMM_SUCCESS and len(data) == length:
                return bytes(data)
            self._needs_quiesce = True
        return None

    def _make_groups(self) -> None:
        self.telemetry_reader = dxl.GroupSyncRead(self.port, self.ph, self.block_start, self.block_length)
        err = self.robot.bus.register("hardware_error_status")
        self.error_reader = dxl.GroupSyncRead(self.port, self.ph, err.address, err.size)
        goal = self.robot.bus.register("goal_position")
        self.goal_writer = dxl.GroupSyncWrite(self.port, self.ph, goal.address, goal.size)
        for sid in self.ids:
            self.telemetry_reader.addParam(sid)
            self.error_reader.addParam(sid)
            self.goal_writer.addParam(sid, [0] * goal.size)
        self._cycles = 0

    def _sync_read_block(self) -> dict[int, bytes]:
        reader = self.telemetry_reader
        blocks = self._fresh_group_read(reader, reader.fastSyncRead if self.fast_sync_read else reader.txRxPacket)
        return blocks

    def read(self) -> TelemetrySample:
        sample = super().read()
        if self.indirect_active:
            return sample                         # hardware_error came with this very read
        self._cycles += 1
        if self._cycles % self.hardware_error_every == 1 or self.hardware_error_every == 1:
            self._refresh_hardware_error()
        sample.hardware_error = self.hardware_error.copy()
        return sample

    def _refresh_hardware_error(self) -> None:
        reader = self.error_reader
        for sid in self.ids:
            reader.data_dict[sid] = []
        result = self._guard(reader.txRxPacket, "hardware error read")
        if result != self.COMM_SUCCESS:
            self._needs_quiesce = True   # keep the last known status; the next refresh retries
            return
        for j, sid in enumerate(self.ids):
            data = reader.data_dict.get(sid) or []
            if len(data) == 1:
                self.hardware_error[j] = data[0]

    def _value(self, block: bytes, name: str) -> int:
        f = self.fields[name]
        return int.from_bytes(block[f.offset:f.offset + f.size], "little", signed=name in self.SIGNED)

    def _decode(self, blocks: dict[int, bytes], stamp_ns: int) -> TelemetrySample:
        n = len(self.ids)
        raw = self._raw_registers(blocks)
        cal = self.calibration
        signs = np.array([c.sign for c in cal.joints])
        return TelemetrySample(
            stamp_ns=stamp_ns,
            position=np.array([cal.to_radians(j, raw[3, j]) for j in range(n)]),
            velocity=signs * raw[2] * self.velocity_scale,
            load=signs * raw[0] * self.load_scale,
            current=signs * raw[1] * self.current_scale,
            voltage=raw[4] * self.voltage_scale,
            temperature=raw[5] * self.temperature_scale,
            hardware_error=(np.array([blocks[sid][0] for sid in self.ids], dtype=np.uint8) if self.indirect_active
                            else self.hardware_error.copy()),
            moving=np.abs(raw[2]) > 0,
        )

    def _encode_goal(self, joint: int, angle_rad: float) -> list[int]:
        return list(int(self.calibration.to_counts(joint, angle_rad)).to_bytes(4, "little", signed=True))


def make_bus(robot: RobotTable, port: str, **kwargs) -> ServoBus:
    """The bus class for ``robot.bus.family`` (feetech_sts or dynamixel)."""
    family = robot.bus.family
    if family.startswith("feetech"):
        kwargs.pop("fast_sync_read", None)
        kwargs.pop("hardware_error_every", None)
        return FeetechBus(robot, port, **kwargs)
    if family == "dynamixel":
        return DynamixelBus(robot, port, **kwargs)
    raise BusError(f"robot {robot.name} has bus family {family!r}, which has no servo bus driver")
