"""A servo bus on a pseudo-terminal: the official SDKs open its path as if it were a USB adapter.

One serving thread per emulator reads the host's bytes from the pty master, lets the protocol
engine answer, and writes the status packets back, optionally through injected faults (dropped,
corrupted or late replies, an echoing adapter) and with the wire time of a real baud rate.
``vanish``/``reappear`` unplug and replug the adapter (same ``link`` path, new pty).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import select
import termios
import threading
import time
import tty
from dataclasses import dataclass, fields
from pathlib import Path

from na_description.robot_table import RobotTable, load_robot
from na_sim.bus.backend import ArmBackend
from na_sim.bus.engine import BusEngine, Reply

LOG = logging.getLogger("na_sim.bus")

#: an incomplete packet with no new byte for this long is garbage: the servos resynchronise
STALE_PACKET_S = 0.02
#: with wire timing, the last part of a reply's wait is spun instead of slept (timer slack)
SPIN_S = 0.0005


@dataclass(frozen=True)
class FaultSpec:
    """What goes wrong on the bus, per reply, drawn from a seeded generator.

    drop/corrupt/late are probabilities per status packet; echo=1 makes the adapter echo every
    byte the host sends (as half-duplex adapters without echo suppression do); late_ms is how much
    later a late reply comes (beyond the SDKs' ~34 ms packet timeout); ids limits the faults to
    replies from those servo ids. vanish_after unplugs the adapter that many seconds after start;
    reappear_after plugs it back in (same link path, new pty) that many seconds later.
    """

    drop: float = 0.0
    corrupt: float = 0.0
    late: float = 0.0
    echo: bool = False
    seed: int = 0
    late_ms: float = 100.0
    ids: frozenset[int] | None = None
    vanish_after: float | None = None
    reappear_after: float | None = None

    def __post_init__(self) -> None:
        for name in ("drop", "corrupt", "late"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault probability {name}={value} is not within 0..1")
        if self.late_ms < 0:
            raise ValueError(f"late_ms={self.late_ms} must be >= 0")
        for name in ("vanish_after", "reappear_after"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name}={value} must be >= 0 seconds")

    @classmethod
    def parse(cls, spec: str) -> FaultSpec:
        """``"drop=0.05,corrupt=0.02,late=0.01,echo=1,seed=3,late_ms=80,ids=2+3,vanish_after=5,reappear_after=2"``."""
        known = {f.name for f in fields(cls)}
        values: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, sep, text = item.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise ValueError(f"bad fault item {item!r} in {spec!r}; expected key=value with key in "
                                 f"{', '.join(sorted(known))}")
            try:
                if key == "echo":
                    values[key] = text.strip().lower() in ("1", "true", "yes", "on")
                elif key == "seed":
                    values[key] = int(text)
                elif key == "ids":
                    values[key] = frozenset(int(i) for i in text.split("+") if i.strip())
                else:
                    values[key] = float(text)
            except ValueError:
                raise ValueError(f"bad value in fault item {item!r} of {spec!r}") from None
        return cls(**values)  # type: ignore[arg-type]

    def __str__(self) -> str:
        parts = [f"drop={self.drop:g}", f"corrupt={self.corrupt:g}", f"late={self.late:g}",
                 f"echo={int(self.echo)}", f"seed={self.seed}", f"late_ms={self.late_ms:g}"]
        if self.ids is not None:
            parts.append("ids=" + "+".join(map(str, sorted(self.ids))))
        if self.vanish_after is not None:
            parts.append(f"vanish_after={self.vanish_after:g}")
        if self.reappear_after is not None:
            parts.append(f"reappear_after={self.reappear_after:g}")
        return ",".join(parts)

    def applies_to(self, reply: Reply) -> bool:
        return self.ids is None or any(i in self.ids for i in reply.servo_ids)


@dataclass
class BusStats:
    """Counters of what the emulator saw and did (read them at any time)."""

    requests: int = 0  # instruction packets decoded
    malformed: int = 0  # bytes skipped while resynchronising + packets with a bad checksum
    replies: int = 0  # status packets written
    dropped: int = 0
    corrupted: int = 0
    late: int = 0
    echoed_bytes: int = 0
    wrong_baud: int = 0  # instructions no servo heard because the host's baud rate was not theirs
    bytes_in: int = 0
    bytes_out: int = 0


class BusEmulator:
    """Serves one ``BusEngine`` on a pty (see module doc)."""

    def __init__(
        self,
        engine: BusEngine,
        faults: FaultSpec | None = None,
        link: str | Path | None = None,
        wire_baud: int | None = None,
    ) -> None:
        if wire_baud is not None and wire_baud <= 0:
            raise ValueError(f"wire_baud must be positive, got {wire_baud}")
        self.engine = engine
        self.link = Path(link) if link is not None else None
        self.wire_baud = wire_baud
        self.stats = BusStats()
        self._faults = faults
        self._rng = random.Random(faults.seed if faults else 0)
        self._master: int | None = None
        self._slave: int | None = None
        self._wake: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._slave_path: str | None = None
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []
        self._stopped_by_user = False

    # ----------------------------------------------------------------- lifecycle
    @property
    def path(self) -> str:
        """What to give the SDK's PortHandler: ``link`` when set, else the pty slave."""
        if self.link is not None:
            return str(self.link)
        if self._slave_path is None:
            raise RuntimeError("the bus emulator is not started")
        return self._slave_path

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> str:
        """Open the pty, start serving; returns the device path."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the bus emulator is already running")
            self._stopped_by_user = False
            self._open()
            faults = self._faults
            if faults is not None and faults.vanish_after is not None:
                self._schedule(faults.vanish_after, self._timed_vanish)
        return self.path

    def stop(self) -> None:
        """Stop serving, close every fd, remove the link. Safe to call twice."""
        with self._lock:
            self._stopped_by_user = True
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()
            self._close()

    def vanish(self) -> None:
        """Unplug: close the pty (the host's open port fails) and remove the link path."""
        with self._lock:
            self._close()

    def reappear(self) -> str:
        """Replug: a new pty behind the same ``link`` path; returns the device path."""
        with self._lock:
            if self._thread is None:
                self._open()
        return self.path

    def _schedule(self, delay: float, action) -> None:
        timer = threading.Timer(delay, action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _timed_vanish(self) -> None:
        with self._lock:
            if self._stopped_by_user or self._thread is None:
                return
            LOG.info("bus emulator: vanishing (fault injection)")
            self._close()
            faults = self._faults
            if faults is not None and faults.reappear_after is not None:
                self._schedule(faults.reappear_after, self._timed_reappear)

    def _timed_reappear(self) -> None:
        with self._lock:
            if self._stopped_by_user or self._thread is not None:
                return
            LOG.info("bus emulator: reappearing (fault injection)")
            self._open()

    def set_faults(self, faults: FaultSpec | None) -> None:
        """Change the fault injection from now on (None = a clean bus); reseeds the generator."""
        self._rng = random.Random(faults.seed if faults else 0)
        self._faults = faults

    @property
    def faults(self) -> FaultSpec | None:
        return self._faults

    def __enter__(self) -> BusEmulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _open(self) -> None:
        master, slave = os.openpty()
        tty.setraw(slave)  # no line discipline: bytes pass unchanged, no local echo
        self._master, self._slave = master, slave
        self._slave_path = os.ttyname(slave)
        self._wake = os.pipe()
        if self.link is not None:
            if self.link.exists() and not self.link.is_symlink():
                self._close_fds()
                raise FileExistsError(f"{self.link} exists and is not a symlink; refusing to replace it")
            tmp = self.link.with_name(f".{self.link.name}.{os.getpid()}.tmp")
            try:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                tmp.symlink_to(self._slave_path)
                tmp.replace(self.link)  # atomic: a reader sees the old or the new pty, never nothing
            except OSError as exc:
                self._close_fds()
                raise OSError(f"cannot create the bus link {self.link}: {exc}") from exc
        self._stopping.clear()
        self._thread = threading.Thread(target=self._serve, name=f"bus-{self.engine.robot.name}", daemon=True)
        self._thread.start()

    def _close(self) -> None:
        if self._thread is not None:
            self._stopping.set()
            if self._wake is not None:
                os.write(self._wake[1], b"x")
            self._thread.join()
            self._thread = None
        if self.link is not None and self.link.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                if os.readlink(self.link) == self._slave_path:
                    self.link.unlink()
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in (self._master, self._slave, *(self._wake or ())):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._master = self._slave = self._wake = None

    # ----------------------------------------------------------------- serving
    def _serve(self) -> None:
        assert self._master is not None and self._wake is not None
        master, wake = self._master, self._wake[0]
        buffer = bytearray()
        last_byte = time.monotonic()
        while not self._stopping.is_set():
            timeout = STALE_PACKET_S if buffer else None
            try:
                ready, _, _ = select.select([master, wake], [], [], timeout)
            except (OSError, ValueError):
                break
            if wake in ready:
                break
            now = time.monotonic()
            if master in ready:
                try:
                    data = os.read(master, 4096)
                except OSError:
                    break
                if not data:
                    break
                self.stats.bytes_in += len(data)
                faults = self._faults
                if faults is not None and faults.echo:
                    self._send(data)
                    self.stats.echoed_bytes += len(data)
                buffer += data
                last_byte = now
            elif buffer and now - last_byte >= STALE_PACKET_S:
                del buffer[0]  # a truncated packet: skip a byte and look for the next header
                self.stats.malformed += 1
            try:
                self._process(buffer, now)
            except Exception:  # a bug must not kill the bus: log it and drop what we had
                LOG.exception("bus emulator: error while handling a packet; buffer discarded")
                buffer.clear()

    def _process(self, buffer: bytearray, received_at: float) -> None:
        while buffer:
            consumed, request = self.engine.extract(buffer)
            del buffer[:consumed]
            if request is None:
                if consumed:  # garbage before a header
                    self.stats.malformed += consumed
                    continue
                return  # an incomplete packet: wait for its remaining bytes
            self.stats.requests += 1
            if not request.checksum_ok:
                self.stats.malformed += 1
            self.engine.line_baud = self._host_baud()
            if self.engine.line_baud is not None and not self.engine.reachable():
                self.stats.wrong_baud += 1
            replies = self.engine.handle(request)
            self._reply(replies, consumed, received_at)

    def _reply(self, replies: list[Reply], request_length: int, received_at: float) -> None:
        """Send the status packets of one instruction, through the faults, in one write where possible.

        The SDKs read a group's replies as one stream, so the replies of a sync read go out together
        (with wire timing: when the last of them would have crossed the wire); a late reply first
        flushes the ones before it, which stay on time.
        """
        sent_bytes = request_length
        faults = self._faults  # one fault configuration for the whole instruction
        pending: list[bytes] = []
        due = received_at
        for reply in replies:
            data = reply.data
            if faults is not None and faults.applies_to(reply):
                if faults.drop and self._rng.random() < faults.drop:
                    self.stats.dropped += 1
                    continue
                if faults.corrupt and self._rng.random() < faults.corrupt:
                    data = data[:-1] + bytes([data[-1] ^ 0xA5])  # a wrong checksum/CRC byte
                    self.stats.corrupted += 1
                if faults.late and self._rng.random() < faults.late:
                    self.stats.late += 1
                    self._flush(pending, due)
                    if self._stopping.wait(faults.late_ms / 1000.0):
                        return
            sent_bytes += len(data)
            if self.wire_baud:
                due = received_at + sent_bytes * 10.0 / self.wire_baud + reply.return_delay_s
            pending.append(data)
        self._flush(pending, due)

    def _flush(self, pending: list[bytes], due: float) -> None:
        if not pending:
            return
        if self.wire_baud:
            _wait_until(due)
        # Counted before the write: once the host has read a reply, the stats already include it.
        self.stats.replies += len(pending)
        self._send(b"".join(pending))
        pending.clear()

    def _host_baud(self) -> int | None:
        """The baud rate the host set on its end of the pty (None if it cannot be told)."""
        try:
            speed = termios.tcgetattr(self._master)[5]  # type: ignore[arg-type]
        except (termios.error, TypeError):
            return None
        return _TERMIOS_BAUDS.get(speed)

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._master, view)  # type: ignore[arg-type]
            except BlockingIOError:
                time.sleep(0.0005)
                continue
            except OSError:
                return
            self.stats.bytes_out += written
            view = view[written:]


_TERMIOS_BAUDS = {
    getattr(termios, f"B{rate}"): rate
    for rate in (9600, 19200, 38400, 57600, 115200, 230400, 460800, 500000, 576000, 921600, 1000000,
                 1152000, 1500000, 2000000, 2500000, 3000000, 3500000, 4000000)
    if hasattr(termios, f"B{rate}")
}


def _wait_until(due: float) -> None:
    """Sleep, then spin the last half millisecond: a plain sleep overshoots a 1 ms wire time."""
    remaining = due - time.monotonic()
    if remaining > SPIN_S:
        time.sleep(remaining - SPIN_S)
    while time.monotonic() < due:
        pass


def make_emulator(
    robot: str | RobotTable,
    backend: ArmBackend,
    faults: FaultSpec | None = None,
    link: str | None = None,
    *,
    wire_baud: int | None = None,
    initial_torque: bool = False,
) -> BusEmulator:
    """A Feetech or Dynamixel emulator (by ``robot.bus.family``) for ``backend``; call ``start()``.

    The servos power up with torque off (as real ones do) unless ``initial_torque``; the backend is
    told so. ``wire_baud`` delays each reply by the time its bytes would take on a real bus.
    """
    from na_sim.bus.dynamixel import DynamixelEngine
    from na_sim.bus.feetech import FeetechEngine

    table = load_robot(robot) if isinstance(robot, str) else robot
    engines = {"dynamixel": DynamixelEngine, "feetech_sts": FeetechEngine}
    family = table.bus.family
    if family not in engines:
        raise ValueError(f"robot {table.name} has bus family {family!r}; emulated families: {', '.join(engines)}")
    engine = engines[family](table, backend, initial_torque=initial_torque)
    return BusEmulator(engine, faults=faults, link=link, wire_baud=wire_baud)
