"""The driver loop without ROS: read the bus, step goals toward commands safely, recover from faults.

``DriverCore.cycle()`` is one control cycle: one telemetry read and (when a goal is due) one goal
write. It never returns a sample that was not read in this cycle; a failed read returns None and is
counted; an unplugged adapter is reopened every ``reconnect_period_s`` until it comes back. The ROS
nodes (driver_node, teleop_node) and the benchmark are thin shells around it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from na_driver.bus import BusDisconnectedError, BusError, BusReadError, ServoBus, TelemetrySample


class CommandLimiter:
    """Turns position commands into safe goals: clamped to the joint limits, then moved toward at
    most ``max_step`` rad per cycle from the previous goal (starting at the measured position)."""

    def __init__(self, joint_names: Sequence[str], position_min: Sequence[float],
                 position_max: Sequence[float], max_step: float) -> None:
        self.joint_names = tuple(joint_names)
        self.position_min = np.asarray(position_min, dtype=np.float64)
        self.position_max = np.asarray(position_max, dtype=np.float64)
        if not (len(self.joint_names) == len(self.position_min) == len(self.position_max)):
            raise ValueError("joint names and limits must have one entry per joint")
        if np.any(self.position_min >= self.position_max):
            raise ValueError("every position_min must be below its position_max")
        if not (math.isfinite(max_step) and max_step > 0):
            raise ValueError(f"max_step must be a positive number of rad per cycle, got {max_step}")
        self.max_step = float(max_step)
        self._index = {name: i for i, name in enumerate(self.joint_names)}
        self._lock = threading.Lock()
        self.target: np.ndarray | None = None   # clamped command, rad
        self.goal: np.ndarray | None = None     # last goal handed to the bus, rad
        self.commands_received = 0
        self.commands_rejected = 0

    def set_command(self, names: Sequence[str], positions: Sequence[float]) -> list[str]:
        """Update the target of the named joints; returns a list of problems (unknown names, NaN)."""
        problems: list[str] = []
        if len(names) != len(positions):
            self.commands_rejected += 1
            return [f"command has {len(names)} names but {len(positions)} positions"]
        with self._lock:
            base = self.target if self.target is not None else self.goal
            if base is None:
                self.commands_rejected += 1
                return ["no position measured yet: command ignored"]
            target = base.copy()
            for name, value in zip(names, positions):
                i = self._index.get(name)
                if i is None:
                    problems.append(f"unknown joint {name!r}")
                elif not math.isfinite(value):
                    problems.append(f"joint {name!r}: position {value} is not finite")
                else:
                    target[i] = value
            self.target = np.clip(target, self.position_min, self.position_max)
            self.commands_received += 1
            if problems:
                self.commands_rejected += 1
        return problems

    def start_from(self, measured: np.ndarray) -> np.ndarray:
        """Hold the measured position exactly (a joint outside its limits is not yanked back: commands,
        which are clamped, bring it in at max_step per cycle); forget old commands."""
        with self._lock:
            self.goal = np.asarray(measured, dtype=np.float64).copy()
            self.target = None
            return self.goal.copy()

    def next_goal(self) -> np.ndarray | None:
        """The goal for this cycle, or None when no command has arrived since the start."""
        with self._lock:
            if self.target is None or self.goal is None:
                return None
            step = np.clip(self.target - self.goal, -self.max_step, self.max_step)
            self.goal = self.goal + step
            return self.goal.copy()


@dataclass
class CycleResult:
    sample: TelemetrySample | None
    goal: np.ndarray | None           # the goal written this cycle (rad), None when none was written
    error: str = ""


@dataclass
class DriverCounters:
    cycles: int = 0
    samples: int = 0
    read_failures: int = 0
    write_failures: int = 0
    reconnect_attempts: int = 0
    reconnects: int = 0
    consecutive_failures: int = 0
    cycle_times: deque = field(default_factory=lambda: deque(maxlen=200))   # monotonic stamps of good samples

    def achieved_rate_hz(self) -> float:
        if len(self.cycle_times) < 2:
            return 0.0
        span = self.cycle_times[-1] - self.cycle_times[0]
        return (len(self.cycle_times) - 1) / span if span > 0 else 0.0


class DriverCore:
    """One arm: bus + command limiter + fault handling."""

    def __init__(self, bus: ServoBus, limiter: CommandLimiter, torque_on_start: bool = True,
                 torque_off_on_shutdown: bool = True, reconnect_period_s: float = 0.5,
                 release_on_start: bool = False, reopen_after_failures: int = 25) -> None:
        self.bus = bus
        self.limiter = limiter
        self.torque_on_start = torque_on_start
        self.torque_off_on_shutdown = torque_off_on_shutdown
        self.release_on_start = release_on_start      # leader arm: make sure torque is off (hand-guided)
        # servos silent for this many cycles in a row (power cut, cable): close and reopen, so that
        # they are pinged again and, when back, held at their pose with torque re-engaged
        self.reopen_after_failures = reopen_after_failures
        self.reconnect_period_s = reconnect_period_s
        self.counters = DriverCounters()
        self.last_error = ""
        self.last_goal: np.ndarray | None = None      # last goal written (published as goal_position)
        self._needs_start = True                       # first good read after (re)connect starts the hold
        self._next_reconnect = 0.0
        self._ever_connected = False

    def open(self) -> None:
        """Connect now (raises BusError when the servos do not answer)."""
        self.bus.connect()
        self._ever_connected = True
        self._needs_start = True

    def cycle(self) -> CycleResult:
        """One cycle: read (and on success step + write the goal). Never raises for bus faults."""
        c = self.counters
        c.cycles += 1
        if not self.bus.connected:
            now = time.monotonic()
            if now < self._next_reconnect:
                return CycleResult(None, None, self.last_error or "not connected")
            self._next_reconnect = now + self.reconnect_period_s
            c.reconnect_attempts += 1
            try:
                self.bus.connect()
            except BusError as exc:
                return self._fail(f"reconnect failed: {exc}")
            c.reconnects += self._ever_connected          # the first connection is not a reconnect
            self._ever_connected = True
            self._needs_start = True
        try:
            sample = self.bus.read()
        except BusDisconnectedError as exc:
            self._next_reconnect = time.monotonic() + self.reconnect_period_s
            return self._fail(f"adapter lost: {exc}")
        except BusReadError as exc:
            return self._fail(str(exc))
        except BusError as exc:
            return self._fail(f"read failed: {exc}")
        c.samples += 1
        c.consecutive_failures = 0
        c.cycle_times.append(time.monotonic())
        goal = None
        try:
            if self._needs_start:
                hold = self.limiter.start_from(sample.position)
                if self.torque_on_start:
                    self.bus.write_goals(hold)     # hold where it stands before the motors engage
                    self.bus.set_torque(True)
                    self.last_goal = hold
                elif self.release_on_start:
                    self.bus.set_torque(False)
                self._needs_start = False          # stays True when torque-on failed: retried next cycle
            else:
                goal = self.limiter.next_goal()
                if goal is not None:
                    self.bus.write_goals(goal)
                    self.last_goal = goal
        except BusError as exc:
            self.last_error = f"write failed: {exc}"
            c.write_failures += 1
            goal = None
        return CycleResult(sample, goal)

    def _fail(self, message: str) -> CycleResult:
        c = self.counters
        c.read_failures += 1
        c.consecutive_failures += 1
        self.last_error = message
        if self.bus.connected and c.consecutive_failures >= self.reopen_after_failures:
            self.bus.close()
            self._next_reconnect = time.monotonic() + self.reconnect_period_s
            self.last_error = f"{c.consecutive_failures} failed reads in a row, reopening: {message}"
            c.consecutive_failures = 0
        return CycleResult(None, None, self.last_error)

    def shutdown(self) -> str:
        """Torque off (when configured) and close; returns a note on what happened."""
        note = "closed"
        if self.torque_off_on_shutdown and self.bus.connected:
            try:
                self.bus.set_torque(False)
                note = "torque off, closed"
            except BusError as exc:
                note = f"torque off FAILED ({exc}), closed"
        self.bus.close()
        return note
