"""Robot tables: the single source of truth per robot.

Every robot-specific constant (joint names and order, servo ids, register map, unit scales,
limits, description files, data period, model file) lives in ``robots/<robot>.yaml`` beside this
module. Drivers, the simulator, the model and the launch files read it through ``load_robot``
instead of repeating numbers, so a change made here reaches all of them.
"""

from __future__ import annotations

import importlib.util
import re
import sysconfig
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

ROBOTS_DIR = "robots"


class RobotTableError(ValueError):
    """A robot table is missing, malformed, or names a file that cannot be found."""


@dataclass(frozen=True)
class Register:
    """One entry of a servo control table."""

    address: int
    size: int


@dataclass(frozen=True)
class BusSpec:
    """The servo bus of a robot (empty family for robots without one)."""

    family: str
    servo_model: str = ""
    model_number: int = 0
    baudrate: int = 0
    ids: tuple[int, ...] = ()
    registers: dict[str, Register] = field(default_factory=dict)
    telemetry_start: int = 0
    telemetry_length: int = 0
    eeprom_end: int = 0
    units: dict[str, float] = field(default_factory=dict)
    sign_bits: dict[str, int] = field(default_factory=dict)
    defaults: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def register(self, name: str) -> Register:
        try:
            return self.registers[name]
        except KeyError:
            raise RobotTableError(f"register {name!r} is not in the {self.servo_model} table") from None


@dataclass(frozen=True)
class RobotTable:
    """Everything robot-specific, read from ``robots/<name>.yaml``."""

    name: str
    display_name: str
    joint_names: tuple[str, ...]
    gripper_joint: str | None
    frames: dict[str, str]
    tf_frames: dict[str, str]
    description: dict[str, dict[str, str]]
    bus: BusSpec
    actuator: dict[str, Any]
    position_min: tuple[float, ...]
    position_max: tuple[float, ...]
    max_step_per_cycle: float
    data_dt: float
    nad_schema: str
    model_file: str
    force_frame: str
    calibration_format: str
    raw: dict[str, Any]

    @property
    def n_joints(self) -> int:
        return len(self.joint_names)

    def joint_index(self, joint: str) -> int:
        try:
            return self.joint_names.index(joint)
        except ValueError:
            raise RobotTableError(f"{self.name} has no joint {joint!r} (joints: {self.joint_names})") from None

    def description_path(self, kind: str) -> Path:
        """Absolute path of the robot's ``mjcf`` or ``urdf`` description file."""
        entry = self.description.get(kind)
        if entry is None:
            raise RobotTableError(f"{self.name} has no {kind} description")
        return _resolve_package_file(entry["package"], entry["path"])

    def robot_description(self) -> str:
        """URDF text for robot_state_publisher/RViz, with every mesh path made an absolute file:// URI
        (the packaged URDFs use paths relative to their folder or package:// URIs of non-ROS packages)."""
        urdf = self.description_path("urdf")
        text = urdf.read_text()

        def absolute(match: re.Match) -> str:
            name = match.group(1)
            if name.startswith("package://"):
                package, _, rel = name[len("package://"):].partition("/")
                path = _resolve_package_file(package, rel)
            elif name.startswith("file://"):
                return match.group(0)
            else:
                path = (urdf.parent / name).resolve()
            return f'filename="file://{path}"'

        return re.sub(r'filename="([^"]+)"', absolute, text)


def robot_names() -> list[str]:
    """Names of all robots with a table."""
    folder = resources.files(__package__).joinpath(ROBOTS_DIR)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


@cache
def load_robot(name: str) -> RobotTable:
    """Load and validate the robot table ``name`` (so101, omx, panda)."""
    source = resources.files(__package__).joinpath(ROBOTS_DIR, f"{name}.yaml")
    if not source.is_file():
        raise RobotTableError(f"unknown robot {name!r}; known robots: {', '.join(robot_names())}")
    raw = yaml.safe_load(source.read_text())
    try:
        return _parse(raw)
    except (KeyError, TypeError) as exc:
        raise RobotTableError(f"robot table {name}.yaml is malformed: {exc!r}") from exc


def _parse(raw: dict[str, Any]) -> RobotTable:
    joints = tuple(raw["joint_names"])
    limits = raw["limits"]
    pmin, pmax = tuple(map(float, limits["position_min"])), tuple(map(float, limits["position_max"]))
    if not (len(pmin) == len(pmax) == len(joints)):
        raise RobotTableError(f"{raw['robot']}: limits do not have one entry per joint")
    if any(lo >= hi for lo, hi in zip(pmin, pmax)):
        raise RobotTableError(f"{raw['robot']}: a position_min is not below its position_max")
    bus_raw = dict(raw["bus"])
    block = bus_raw.pop("telemetry_block", {"start": 0, "length": 0})
    known = {"family", "servo_model", "model_number", "baudrate", "ids", "registers", "eeprom_end",
             "units", "sign_bits", "defaults"}
    bus = BusSpec(
        family=bus_raw["family"],
        servo_model=bus_raw.get("servo_model", ""),
        model_number=int(bus_raw.get("model_number", 0)),
        baudrate=int(bus_raw.get("baudrate", 0)),
        ids=tuple(int(i) for i in bus_raw.get("ids", ())),
        registers={k: Register(int(v[0]), int(v[1])) for k, v in bus_raw.get("registers", {}).items()},
        telemetry_start=int(block["start"]),
        telemetry_length=int(block["length"]),
        eeprom_end=int(bus_raw.get("eeprom_end", 0)),
        units={k: float(v) for k, v in bus_raw.get("units", {}).items()},
        sign_bits={k: int(v) for k, v in bus_raw.get("sign_bits", {}).items()},
        defaults={k: int(v) for k, v in bus_raw.get("defaults", {}).items()},
        extra={k: v for k, v in bus_raw.items() if k not in known},
    )
    if bus.ids and len(bus.ids) != len(joints):
        raise RobotTableError(f"{raw['robot']}: {len(bus.ids)} servo ids for {len(joints)} joints")
    return RobotTable(
        name=raw["robot"],
        display_name=raw.get("display_name", raw["robot"]),
        joint_names=joints,
        gripper_joint=raw.get("gripper_joint"),
        frames=dict(raw.get("frames", {})),
        tf_frames=dict(raw.get("tf_frames", raw.get("frames", {}))),
        description=dict(raw.get("description", {})),
        bus=bus,
        actuator=dict(raw.get("actuator", {})),
        position_min=pmin,
        position_max=pmax,
        max_step_per_cycle=float(limits.get("max_step_per_cycle", 0.05)),
        data_dt=float(raw["data"]["data_dt"]),
        nad_schema=raw["data"]["nad_schema"],
        model_file=raw["model"]["file"],
        force_frame=raw["model"]["force_frame"],
        calibration_format=raw.get("calibration", {}).get("format", ""),
        raw=raw,
    )


def _resolve_package_file(package: str, rel_path: str) -> Path:
    """Find ``rel_path`` inside an installed Python package or a cmeel (example-robot-data) prefix."""
    if package == "example-robot-data":
        for base in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]):
            candidate = Path(base) / "cmeel.prefix" / "share" / "example-robot-data" / rel_path
            if candidate.is_file():
                return candidate
        raise RobotTableError(f"example-robot-data does not provide {rel_path}; is it installed?")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RobotTableError(f"Python package {package!r} (robot description) is not installed")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / rel_path
        if candidate.is_file():
            return candidate
    raise RobotTableError(f"{package} does not contain {rel_path}")
