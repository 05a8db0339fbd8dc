"""Joint calibration: servo position counts <-> joint angles in rad.

The SO-101 reads LeRobot's calibration JSON (one entry per motor: id, drive_mode, homing_offset,
range_min, range_max), so a LeRobot user's existing calibration file works unchanged: the servo
applies Homing_Offset itself (Present_Position = raw - Homing_Offset), and the joint angle is
measured from the middle of the calibrated range, as LeRobot's degree mode does. The OMX uses the
ROBOTIS zero (2048 counts = 0 rad), which is the same arithmetic with a full-turn range.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from na_description.robot_table import RobotTable

CALIBRATION_KEYS = ("id", "drive_mode", "homing_offset", "range_min", "range_max")


class CalibrationError(ValueError):
    """A calibration file is missing, malformed, or does not match the robot."""


@dataclass(frozen=True)
class JointCalibration:
    """Calibration of one servo, in its own position counts."""

    servo_id: int
    drive_mode: int          # 0 = counts grow with the joint angle, 1 = inverted
    homing_offset: int       # written to the servo's Homing_Offset register (0 = leave as is)
    range_min: int           # Present_Position counts at the calibrated range ends
    range_max: int

    @property
    def center(self) -> float:
        """Present_Position counts at 0 rad (middle of the calibrated range)."""
        return (self.range_min + self.range_max) / 2.0

    @property
    def sign(self) -> float:
        return -1.0 if self.drive_mode else 1.0


@dataclass(frozen=True)
class Calibration:
    """Per-joint calibration in robot-table order, plus the counts-per-radian scale."""

    joints: tuple[JointCalibration, ...]
    steps_per_rev: float
    writes_homing_offset: bool   # True when the file asks the driver to program Homing_Offset

    @property
    def counts_per_rad(self) -> float:
        return self.steps_per_rev / (2.0 * math.pi)

    def to_radians(self, joint: int, counts: float) -> float:
        cal = self.joints[joint]
        return cal.sign * (counts - cal.center) / self.counts_per_rad

    def to_counts(self, joint: int, angle_rad: float) -> int:
        cal = self.joints[joint]
        return round(cal.center + cal.sign * angle_rad * self.counts_per_rad)

    def range_radians(self, joint: int) -> tuple[float, float]:
        """The calibrated range in rad (ordered low, high)."""
        cal = self.joints[joint]
        ends = sorted((self.to_radians(joint, cal.range_min), self.to_radians(joint, cal.range_max)))
        return ends[0], ends[1]


def default_calibration(robot: RobotTable) -> Calibration:
    """The servo's own zero: center = position_center (2048 on both families), full-turn range."""
    steps = int(robot.bus.units.get("position_steps_per_rev", 4096))
    center = int(robot.bus.units.get("position_center", steps // 2))
    joints = tuple(
        JointCalibration(servo_id=sid, drive_mode=0, homing_offset=0,
                         range_min=center - steps // 2, range_max=center + steps // 2)
        for sid in robot.bus.ids
    )
    return Calibration(joints=joints, steps_per_rev=float(steps), writes_homing_offset=False)


def load_lerobot_calibration(path: str | Path, robot: RobotTable) -> Calibration:
    """Read a LeRobot calibration JSON (``{motor: {id, drive_mode, homing_offset, range_min,
    range_max}}``) for ``robot``; every joint of the robot table must be present with its servo id."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CalibrationError(f"calibration file {path} does not exist") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"calibration file {path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CalibrationError(f"calibration file {path}: expected an object keyed by motor name")
    steps = int(robot.bus.units.get("position_steps_per_rev", 4096))
    joints = []
    for joint, servo_id in zip(robot.joint_names, robot.bus.ids):
        entry = data.get(joint)
        if not isinstance(entry, dict):
            raise CalibrationError(f"calibration file {path} has no entry for joint {joint!r} "
                                   f"(found: {', '.join(map(str, data)) or 'nothing'})")
        missing = [k for k in CALIBRATION_KEYS if k not in entry]
        if missing:
            raise CalibrationError(f"calibration file {path}: joint {joint!r} lacks {', '.join(missing)}")
        try:
            cal = JointCalibration(
                servo_id=int(entry["id"]), drive_mode=int(entry["drive_mode"]),
                homing_offset=int(entry["homing_offset"]),
                range_min=int(entry["range_min"]), range_max=int(entry["range_max"]),
            )
        except (TypeError, ValueError) as exc:
            raise CalibrationError(f"calibration file {path}: joint {joint!r} has a non-integer value") from exc
        if cal.servo_id != servo_id:
            raise CalibrationError(f"calibration file {path}: joint {joint!r} has servo id {cal.servo_id}, "
                                   f"the {robot.name} robot table says {servo_id}")
        if not 0 <= cal.range_min < cal.range_max < steps:
            raise CalibrationError(f"calibration file {path}: joint {joint!r} range "
                                   f"[{cal.range_min}, {cal.range_max}] is not within 0..{steps - 1}")
        if cal.drive_mode not in (0, 1):
            raise CalibrationError(f"calibration file {path}: joint {joint!r} drive_mode must be 0 or 1")
        joints.append(cal)
    return Calibration(joints=tuple(joints), steps_per_rev=float(steps), writes_homing_offset=True)


def write_lerobot_calibration(path: str | Path, robot: RobotTable, calibration: Calibration) -> None:
    """Write ``calibration`` in LeRobot's JSON layout (used by tests and by users migrating)."""
    data = {
        joint: {"id": cal.servo_id, "drive_mode": cal.drive_mode, "homing_offset": cal.homing_offset,
                "range_min": cal.range_min, "range_max": cal.range_max}
        for joint, cal in zip(robot.joint_names, calibration.joints)
    }
    Path(path).write_text(json.dumps(data, indent=4) + "\n")
