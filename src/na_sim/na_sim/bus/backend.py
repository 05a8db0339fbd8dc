"""What an emulated servo bus reports and obeys: the boundary between bus emulation and physics.

The bus emulators encode a ``ServoState`` into register counts when a host reads the telemetry
block and forward goal/torque writes to an ``ArmBackend``. The physics simulation implements
``ArmBackend``; ``StaticBackend`` is the trivial in-memory one used by protocol tests and benchmarks.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable


@dataclass
class ServoState:
    """One servo's telemetry in SI units (one per joint, robot-table order)."""

    position: float  # rad (joint angle; 0 = the robot's zero)
    velocity: float  # rad/s
    load: float  # signed duty fraction -1..1
    current: float  # A
    voltage: float  # V
    temperature: float  # deg C
    moving: bool = False
    hardware_error: int = 0  # servo error/status bits in the servo's own encoding


@runtime_checkable
class ArmBackend(Protocol):
    """What the emulated servos report and obey (implemented by the physics sim)."""

    def servo_states(self) -> list[ServoState]:
        """A thread-safe snapshot of every joint, robot-table order."""
        ...

    def set_goal_positions(self, goals: Mapping[int, float]) -> None:
        """New position goals: joint index -> rad."""
        ...

    def set_torque_enabled(self, joint: int, enabled: bool) -> None:
        """Switch one joint's motor on or off."""
        ...


class StaticBackend:
    """In-memory ``ArmBackend``: a goal becomes the position at once; everything else is as set.

    Protocol tests set the state they expect to read back through the bus (``set_state``) and
    inspect what the bus wrote (``goals``, ``torque_enabled``).
    """

    def __init__(
        self,
        n_joints: int,
        voltage: float = 12.0,
        temperature: float = 30.0,
        states: Sequence[ServoState] | None = None,
    ) -> None:
        if states is not None and len(states) != n_joints:
            raise ValueError(f"StaticBackend: {len(states)} states for {n_joints} joints")
        self._lock = threading.Lock()
        self._states = (
            [replace(s) for s in states]
            if states is not None
            else [ServoState(0.0, 0.0, 0.0, 0.0, voltage, temperature) for _ in range(n_joints)]
        )
        self.goals: list[float | None] = [None] * n_joints  # last goal written per joint (rad)
        self.torque_enabled: list[bool] = [False] * n_joints
        self.goal_writes = 0  # number of set_goal_positions calls (one per bus transaction)

    @property
    def n_joints(self) -> int:
        return len(self._states)

    def servo_states(self) -> list[ServoState]:
        with self._lock:
            return [replace(s) for s in self._states]

    def set_goal_positions(self, goals: Mapping[int, float]) -> None:
        with self._lock:
            for joint, goal in goals.items():
                self._check_joint(joint)
                self.goals[joint] = float(goal)
                self._states[joint].position = float(goal)
            self.goal_writes += 1

    def set_torque_enabled(self, joint: int, enabled: bool) -> None:
        with self._lock:
            self._check_joint(joint)
            self.torque_enabled[joint] = bool(enabled)

    def set_state(self, joint: int, **fields: float | int | bool) -> None:
        """Overwrite fields of one joint's state (e.g. ``set_state(2, load=-0.3, current=0.4)``)."""
        with self._lock:
            self._check_joint(joint)
            self._states[joint] = replace(self._states[joint], **fields)

    def _check_joint(self, joint: int) -> None:
        if not 0 <= joint < len(self._states):
            raise IndexError(f"joint index {joint} out of range 0..{len(self._states) - 1}")
