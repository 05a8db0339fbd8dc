"""Neural Actuation Dataset (NAD) CSV files: read them into physical units, and write them back.

The NAD schema lives only here. Every other module (features, training, recorder) sees a
``Trajectory`` whose telemetry is already in the project's units (rad, rad/s, duty fraction -1..1,
A, V, deg C), so a unit conversion happens exactly once, on the way in, and its inverse (with the
register's integer rounding) on the way out. Unit scales come from the robot table.

Layouts understood: a full NAD release (``<root>/data/so101/<task>/<payload>/<split>/*.csv``,
``data/force_sensor/<direction>/...``, ``data/franka/lift_hold/<split>/400_003.csv`` ...) and the
subset layout of ``../shared/nad`` (the same without ``data/``).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from na_description.robot_table import load_robot

SENTINEL = -999.0  # "no reading" in NAD force columns
SPLITS = ("train", "validation", "test")
# Where each robot's files sit under a NAD root (with or without the release's ``data/`` prefix).
ROBOT_FOLDERS: dict[str, tuple[str, ...]] = {
    "so101": ("so101",),
    "omx": ("force_unlabeled", "force_sensor", "weight", "motor_condition"),
    "panda": ("franka",),
}
# Dataset fact (not a robot constant): in the OMX ``*_degrade`` tasks joint 3 was mechanically degraded.
DEGRADED_JOINT = {"omx": "joint3"}
DEGRADE_SUFFIX = "_degrade"


class NADFormatError(ValueError):
    """A NAD file has an unknown header, a short row, a non-numeric cell, or values that cannot be written."""


@dataclass(frozen=True)
class ColumnGroup:
    """Columns of one quantity: how file values map to physical units and how they are written back.

    physical = file_value * scale. On writing, file_value = physical / scale, rounded to a multiple of
    ``quantum`` (register resolution in file units; 1.0 = integer counts, written without a decimal
    point); ``quantum`` None keeps the float as is.
    """

    quantity: str
    columns: tuple[str, ...]
    scale: float = 1.0
    quantum: float | None = None
    per_joint: bool = True
    sentinel: bool = False  # -999 means "no reading" (NaN in memory)
    decimals: int | None = None  # fixed decimals on writing (SO-101 force labels are "-2.94"), else repr


@dataclass(frozen=True)
class Schema:
    robot: str
    groups: tuple[ColumnGroup, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return ("timestamp", *(c for g in self.groups for c in g.columns))

    def group(self, quantity: str) -> ColumnGroup:
        for g in self.groups:
            if g.quantity == quantity:
                return g
        raise KeyError(f"the {self.robot} NAD schema has no quantity {quantity!r}")


def _numbered(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


def _xyz(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}_{a}" for a in "xyz")


@cache
def schema_for(robot: str) -> Schema:
    """The NAD column schema of ``robot`` (so101, omx, panda), with unit scales from its robot table."""
    table = load_robot(robot)
    n = table.n_joints
    units = table.bus.units
    if table.nad_schema == "so101":
        rad_per_step = 2.0 * math.pi / units["position_steps_per_rev"]
        groups = (
            ColumnGroup("position", _numbered("pos", n)),
            ColumnGroup("goal_position", _numbered("goal_pos", n)),
            ColumnGroup("current", _numbered("current", n), units["current_a_per_count"], 1.0),
            ColumnGroup("velocity", _numbered("vel", n), rad_per_step * units["velocity_step_per_s"], 1.0),
            ColumnGroup("load", _numbered("load", n), 1.0 / units["load_full_scale"], 1.0),
            ColumnGroup("temperature", _numbered("temp", n), units["temperature_c_per_count"], 1.0),
            ColumnGroup("voltage", _numbered("volts", n), units["voltage_v_per_count"], 1.0),
            ColumnGroup("force", _xyz("force"), per_joint=False, sentinel=True, decimals=2),
        )
    elif table.nad_schema == "omx":
        # OMX files already hold mA, rad/s, V and raw PWM counts (quantized to the XM430 registers).
        rad_s_per_count = units["velocity_rpm_per_count"] * 2.0 * math.pi / 60.0
        groups = (
            ColumnGroup("position", _numbered("pos", n)),
            ColumnGroup("aperture", ("aperture",), per_joint=False),
            ColumnGroup("goal_position", _numbered("goal_pos", n)),
            ColumnGroup("goal_aperture", ("goal_aperture",), per_joint=False),
            ColumnGroup("current", _numbered("current", n), 1e-3, units["current_a_per_count"] * 1e3),
            ColumnGroup("velocity", _numbered("vel", n), 1.0, rad_s_per_count),
            ColumnGroup("temperature", _numbered("temp", n), units["temperature_c_per_count"], 1.0),
            ColumnGroup("load", _numbered("pwm", n), 1.0 / units["pwm_full_scale"], 1.0),
            ColumnGroup("voltage", _numbered("volts", n), 1.0, units["voltage_v_per_count"]),
            ColumnGroup("force", _xyz("force"), per_joint=False, sentinel=True),
            ColumnGroup("force_gripper", _xyz("force_gripper"), per_joint=False, sentinel=True),
        )
    elif table.nad_schema == "panda":
        groups = (
            ColumnGroup("position", _numbered("pos", n)),
            ColumnGroup("gripper_width", ("gripper_width",), per_joint=False),
            ColumnGroup("velocity", _numbered("vel", n)),
            ColumnGroup("velocity_desired", _numbered("vel_d", n)),
            ColumnGroup("torque_desired", _numbered("tau_d", n)),
            ColumnGroup("torque", _numbered("tau", n)),
            ColumnGroup("torque_external", _numbered("tau_ext", n)),
            ColumnGroup("goal_position", _numbered("cmd_pos", n)),
            ColumnGroup("motor_position", _numbered("motor_pos", n)),
            ColumnGroup("motor_velocity", _numbered("motor_vel", n)),
            ColumnGroup("force", _xyz("force"), per_joint=False, sentinel=True),
            ColumnGroup("wrench_torque", _xyz("torque_ext"), per_joint=False, sentinel=True),
            ColumnGroup("lifting", ("lifting",), per_joint=False, quantum=1.0),
        )
    else:
        raise NADFormatError(f"robot {robot!r} has no NAD schema (nad_schema={table.nad_schema!r})")
    return Schema(robot=robot, groups=groups)


@dataclass
class Trajectory:
    """One NAD trajectory in physical units.

    ``quantities`` holds [T, n_joints] arrays ("position", "goal_position", "velocity", "load",
    "current", "voltage", "temperature") plus robot extras ([T] for single columns such as the OMX
    "aperture", [T, 3] for vectors). ``force`` is [T, 3] N with NaN where the file says -999.
    ``condition`` is [n_joints] (1 normal, 0 degraded) where the dataset labels it, else None.
    """

    robot: str
    path: Path | None
    task: str
    payload_kg: float | None
    time: np.ndarray
    quantities: dict[str, np.ndarray]
    force: np.ndarray
    condition: np.ndarray | None = None
    split: str | None = None
    category: str | None = None  # top folder of the release: so101, force_sensor, weight, franka, ...

    def __len__(self) -> int:
        return int(self.time.shape[0])

    @property
    def force_labelled(self) -> np.ndarray:
        """[T] bool: frames whose force has a label on every axis the dataset labels (not all NaN)."""
        return ~np.all(np.isnan(self.force), axis=1)

    def force_or_zero(self) -> np.ndarray:
        """[T, 3] force with unlabelled (-999) entries read as 0 N, as the published metric does."""
        return np.nan_to_num(self.force, nan=0.0)


# ----------------------------------------------------------------------------------------- reading


GRIPPER_APERTURE_KEY = "aperture_mm_poly"   # robot table data key: numpy.polyval coefficients, rad -> mm


def gripper_aperture_mm(robot: str, gripper_angle):
    """NAD's gripper opening in mm (OMX ``aperture``) from the gripper motor angle in rad, by the robot
    table's fitted polynomial. The one place this mapping is evaluated (recorder, simulator, runtime)."""
    coefficients = load_robot(robot).raw.get("data", {}).get(GRIPPER_APERTURE_KEY)
    if coefficients is None:
        raise NADFormatError(f"robot {robot} has no {GRIPPER_APERTURE_KEY} in its table")
    return np.polyval(coefficients, gripper_angle)


def add_gripper_aperture(robot: str, quantities: dict[str, np.ndarray]) -> None:
    """Add ``aperture``/``goal_aperture`` [T] from ``position``/``goal_position`` [T, J] when the robot's NAD
    schema has those columns (the OMX); other robots are left unchanged."""
    table = load_robot(robot)
    if table.nad_schema != "omx":
        return
    gripper = table.joint_index(table.gripper_joint)
    quantities["aperture"] = gripper_aperture_mm(robot, quantities["position"][:, gripper])
    quantities["goal_aperture"] = gripper_aperture_mm(robot, quantities["goal_position"][:, gripper])


def detect_robot(header: Sequence[str]) -> str:
    """Which robot's NAD schema ``header`` is; raises NADFormatError naming the closest schema's gaps."""
    names = set(header)
    best: tuple[int, str, list[str]] | None = None
    for robot in ROBOT_FOLDERS:
        missing = [c for c in schema_for(robot).columns if c not in names]
        if not missing:
            return robot
        if best is None or len(missing) < best[0]:
            best = (len(missing), robot, missing)
    assert best is not None
    raise NADFormatError(
        f"unknown NAD header ({len(header)} columns: {', '.join(header[:6])}, ...); closest schema is "
        f"{best[1]}, which lacks {best[2][:8]}"
    )


def load_trajectory(path: str | os.PathLike, robot: str | None = None) -> Trajectory:
    """Read one NAD CSV into physical units; the robot is inferred from the header when not given."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"NAD file not found: {path}")
    with path.open(newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    if not rows:
        raise NADFormatError(f"{path}: empty file (no header)")
    header = [c.strip().lstrip("\ufeff") for c in rows[0]]
    robot = robot or detect_robot(header)
    schema = schema_for(robot)
    missing = [c for c in schema.columns if c not in header]
    if missing:
        raise NADFormatError(f"{path}: header is not the {robot} NAD schema; missing columns {missing[:8]}")
    body = rows[1:]
    if not body:
        raise NADFormatError(f"{path}: header only, no data rows")
    for line_no, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise NADFormatError(f"{path}:{line_no}: row has {len(row)} fields, header has {len(header)}")
    values = _to_float(body, path)
    column = {name: i for i, name in enumerate(header)}

    def take(group: ColumnGroup) -> np.ndarray:
        raw = values[:, [column[c] for c in group.columns]]
        if group.sentinel:
            raw = np.where(raw == SENTINEL, np.nan, raw)
        out = raw * group.scale if group.scale != 1.0 else raw
        return out if group.per_joint or len(group.columns) > 1 else out[:, 0]

    quantities = {g.quantity: take(g) for g in schema.groups if g.quantity != "force"}
    info = describe_path(path, robot)
    return Trajectory(
        robot=robot,
        path=path,
        task=info["task"],
        payload_kg=info["payload_kg"],
        time=values[:, column["timestamp"]].copy(),
        quantities=quantities,
        force=take(schema.group("force")),
        condition=condition_labels(robot, path),
        split=info["split"],
        category=info["category"],
    )


def _to_float(rows: list[list[str]], path: Path) -> np.ndarray:
    try:
        return np.array(rows, dtype=np.float64)
    except ValueError:
        for line_no, row in enumerate(rows, start=2):
            for col, cell in enumerate(row):
                try:
                    float(cell)
                except ValueError:
                    raise NADFormatError(f"{path}:{line_no}: column {col + 1} is not a number: {cell!r}") from None
        raise


_PAYLOAD_DIR = re.compile(r"^(\d+(?:\.\d+)?)\s*g$")
_PAYLOAD_IN_NAME = re.compile(r"(?:^|_)(\d+(?:\.\d+)?)g(?:_|$)")
_FRANKA_FILE = re.compile(r"^(\d+)_(\d+)$")


def describe_path(path: str | os.PathLike, robot: str) -> dict:
    """Task, payload (kg), split and category of a NAD file, from where it sits in the release tree."""
    path = Path(path)
    parts = list(path.parent.parts)
    split = parts[-1] if parts and parts[-1] in SPLITS else None
    dirs = parts[:-1] if split else parts
    category = None
    for folder in ROBOT_FOLDERS.get(robot, ()):
        if folder in dirs:
            idx = len(dirs) - 1 - dirs[::-1].index(folder)
            category, dirs = folder, dirs[idx + 1 :]
            break
    payload_kg: float | None = None
    task_dirs = []
    for d in dirs:
        match = _PAYLOAD_DIR.match(d)
        if match:
            payload_kg = float(match.group(1)) / 1000.0
        else:
            task_dirs.append(d)
    task = "/".join(task_dirs) if task_dirs else (category or path.parent.name)
    if payload_kg is None:
        franka = _FRANKA_FILE.match(path.stem) if robot == "panda" else None
        in_name = _PAYLOAD_IN_NAME.search(task)
        if franka:
            payload_kg = float(franka.group(1)) / 1000.0
        elif in_name:
            payload_kg = float(in_name.group(1)) / 1000.0
    return {"task": task, "payload_kg": payload_kg, "split": split, "category": category}


def condition_labels(robot: str, path: str | os.PathLike) -> np.ndarray | None:
    """Per-joint motor condition (1 normal, 0 degraded) where NAD labels it: the OMX motor_condition tasks."""
    path = Path(path)
    degraded = any(p.endswith(DEGRADE_SUFFIX) for p in path.parent.parts)
    if robot not in DEGRADED_JOINT or not (degraded or "motor_condition" in path.parts):
        return None
    table = load_robot(robot)
    labels = np.ones(table.n_joints, dtype=np.float64)
    if degraded:
        labels[table.joint_index(DEGRADED_JOINT[robot])] = 0.0
    return labels


def find_trajectories(root: str | os.PathLike, robot: str, split: str | None = "train") -> list[Path]:
    """All NAD CSV files of ``robot`` under ``root``, sorted.

    ``root`` may be a release folder (with ``data/``), the subset layout (``so101/`` ... at the top) or
    one robot folder itself (``.../so101``, ``.../force_sensor``).

    ``split`` None returns every split. Raises FileNotFoundError when nothing matches, saying where it looked.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"NAD root {root} does not exist")
    if robot not in ROBOT_FOLDERS:
        raise ValueError(f"no NAD data layout known for robot {robot!r} (known: {', '.join(ROBOT_FOLDERS)})")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, not {split!r}")
    looked: list[Path] = []
    found: set[Path] = set()
    folders = ROBOT_FOLDERS[robot]
    tops = [root] if root.name in folders else [b / f for b in (root, root / "data") for f in folders]
    for top in tops:
        looked.append(top)
        if top.is_dir():
            found.update(p for p in top.rglob("*.csv") if split is None or p.parent.name == split)
    if not found:
        raise FileNotFoundError(
            f"no {robot} NAD files (split {split}) under {root}; looked in {', '.join(map(str, looked))}"
        )
    return sorted(found)


def holdout_split(paths: Iterable[str | os.PathLike], per_task: int = 1,
                  fold: int = -1) -> tuple[list[Path], list[Path]]:
    """(train, validation): ``per_task`` files (sorted) of every task folder go to validation.

    A task folder is the folder holding the split folder (so101/pick_and_place/300g is one task of the
    six-task SO-101 protocol). ``fold`` picks which block of ``per_task`` files is held out, for
    cross-validation: -1 (default) the last block, k >= 0 the files k*per_task .. (k+1)*per_task - 1.
    A task with no more than ``per_task`` files stays in train whole, so no task disappears from
    training.
    """
    groups: dict[Path, list[Path]] = {}
    for p in sorted(Path(p) for p in paths):
        key = p.parent.parent if p.parent.name in SPLITS else p.parent
        groups.setdefault(key, []).append(p)
    train: list[Path] = []
    val: list[Path] = []
    for task, files in groups.items():
        if per_task <= 0 or len(files) <= per_task:
            train.extend(files)
            continue
        start = len(files) - per_task if fold < 0 else fold * per_task
        if start + per_task > len(files):
            raise ValueError(f"holdout fold {fold} needs {start + per_task} files per task; "
                             f"{task} has {len(files)}")
        val.extend(files[start:start + per_task])
        train.extend(files[:start] + files[start + per_task:])
    return sorted(train), sorted(val)


# ----------------------------------------------------------------------------------------- writing


def _format_column(values: np.ndarray, group: ColumnGroup, name: str) -> list[str]:
    """File text of one column: inverse unit scale, register rounding, -999 for missing labels."""
    file_values = values / group.scale if group.scale != 1.0 else values
    missing = np.isnan(file_values)
    if missing.any() and not group.sentinel:
        row = int(np.argmax(missing))
        raise NADFormatError(f"cannot write NaN in column {name} (data row {row + 1}): it has no -999 sentinel")
    if not np.all(np.isfinite(file_values[~missing])):
        raise NADFormatError(f"cannot write an infinite value in column {name}")
    out: list[str] = []
    if group.decimals is not None:
        out = [f"{v:.{group.decimals}f}" for v in file_values]
    elif group.quantum is None:
        out = [repr(float(v)) for v in file_values]
    else:
        counts = np.rint(np.where(missing, 0.0, file_values) / group.quantum).astype(np.int64)
        inverse = 1.0 / group.quantum
        if group.quantum == 1.0:
            out = [str(int(c)) for c in counts]
        elif abs(inverse - round(inverse)) < 1e-9:  # e.g. 0.1 V: count / 10 prints "12.9", not 12.900000000000002
            out = [repr(int(c) / round(inverse)) for c in counts]
        else:
            out = [repr(int(c) * group.quantum) for c in counts]
    if group.sentinel:
        out = ["-999" if m else s for s, m in zip(out, missing)]
    return out


def format_trajectory(traj: Trajectory) -> str:
    """The exact NAD CSV text of ``traj`` (header + rows, CRLF)."""
    schema = schema_for(traj.robot)
    n_rows = len(traj.time)
    columns: list[list[str]] = [[repr(float(t)) for t in np.asarray(traj.time, dtype=np.float64)]]
    for group in schema.groups:
        if group.quantity == "force":
            data = traj.force
        elif group.quantity in traj.quantities:
            data = traj.quantities[group.quantity]
        elif group.sentinel and group.quantity == "force_gripper":
            data = np.zeros((n_rows, 3))  # reserved in NAD, always zero
        else:
            raise NADFormatError(f"trajectory lacks {group.quantity!r}, needed by the {traj.robot} NAD schema")
        data = np.asarray(data, dtype=np.float64).reshape(n_rows, -1)
        if data.shape[1] != len(group.columns):
            raise NADFormatError(
                f"{group.quantity!r} has {data.shape[1]} columns, the {traj.robot} schema needs {len(group.columns)}"
            )
        for j, name in enumerate(group.columns):
            columns.append(_format_column(data[:, j], group, name))
    buffer = io.StringIO()
    buffer.write(",".join(schema.columns) + "\r\n")
    for row in zip(*columns):
        buffer.write(",".join(row) + "\r\n")
    return buffer.getvalue()


def write_trajectory(path: str | os.PathLike, traj: Trajectory) -> None:
    """Write ``traj`` as an exact NAD CSV (column names and order, CRLF, -999, register rounding).

    The text is built completely before anything touches the disk, then written to a temporary file
    and renamed, so a bad value raises NADFormatError and leaves no half-written file behind.
    """
    path = Path(path)
    text = format_trajectory(traj)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("w", newline="") as handle:
        handle.write(text)
    os.replace(tmp, path)


def summarize(paths: Sequence[Path], robot: str | None = None) -> list[dict]:
    """One line of facts per file: task, payload, rows, duration, mean period, labelled force frames."""
    out = []
    for path in paths:
        traj = load_trajectory(path, robot)
        dt = float(np.mean(np.diff(traj.time))) if len(traj) > 1 else float("nan")
        out.append({"file": str(path), "robot": traj.robot, "task": traj.task, "payload_kg": traj.payload_kg,
                    "split": traj.split, "rows": len(traj), "duration_s": float(traj.time[-1] - traj.time[0]),
                    "mean_dt_s": dt, "force_labelled_frames": int(traj.force_labelled.sum()),
                    "condition": None if traj.condition is None else traj.condition.tolist()})
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m na_inference.nad ROOT --robot so101``: list and check the NAD files under ROOT."""
    parser = argparse.ArgumentParser(prog="python -m na_inference.nad",
                                     description="Read every NAD file of a robot under ROOT and summarize it.")
    parser.add_argument("root", type=Path, help="NAD release folder, the subset layout, or one robot folder")
    parser.add_argument("--robot", default="so101", choices=sorted(ROBOT_FOLDERS))
    parser.add_argument("--split", default="train", help="train, validation, test or all")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        paths = find_trajectories(args.root, args.robot, None if args.split == "all" else args.split)
        rows = summarize(paths, args.robot)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    print(f"{'task':32s} {'payload':>8s} {'split':>10s} {'rows':>6s} {'dur s':>7s} {'dt ms':>6s} {'labelled':>8s}")
    for r in rows:
        payload = "-" if r["payload_kg"] is None else f"{r['payload_kg']:.3f}"
        print(f"{r['task'][:32]:32s} {payload:>8s} {r['split'] or '-':>10s} {r['rows']:6d} {r['duration_s']:7.1f} "
              f"{1e3 * r['mean_dt_s']:6.2f} {r['force_labelled_frames']:8d}")
    total = sum(r["rows"] for r in rows)
    print(f"{len(rows)} files, {total} rows, read and converted in {elapsed:.2f} s "
          f"({1e6 * elapsed / max(total, 1):.1f} us/row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
