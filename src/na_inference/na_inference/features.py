"""THE feature pipeline: telemetry samples -> model input, shared by training, evaluation, export and the node.

numpy only (the runtime node imports it; never torch). Everything is in physical units (rad, rad/s,
duty fraction, A, V, deg C); normalization happens inside the exported model, with the statistics
kept here in the FeatureSpec and written into the model file.

Reference pitfalls handled on purpose:
- Velocity units: the reference fed SO-101 telemetry velocity in encoder steps/s but simulated
  velocity in rad/s. Here both are rad/s (NAD is converted once by ``nad.py``; a simulator gives
  rad/s), so a rollout and the runtime see the same units.
- Start-up padding: missing past frames are the training MEAN frame in physical units, which is
  exactly zero after normalization, as in the reference's training (not raw zeros, which would be
  far out of distribution after normalization).
- Next-row targets: a window ending at row i is the input for targets at row i+1 (position after
  the simulator step, force label); ``windows`` only builds inputs, target alignment is the
  trainer's and evaluator's job (see ``next_row_targets``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from na_description.robot_table import load_robot

from .nad import Trajectory, schema_for

CLIP = 10.0  # normalized features are clipped to +-CLIP
DEFAULT_HISTORY = 8  # past frames; the model sees history + 1 tokens
# Quantities per robot, in the method's order. SO-101: 7 x 6 = 42. OMX: goal_position, position,
# aperture (1 column), current, velocity, voltage, temperature, position_error = 5+5+1+5+5+5+5+5 = 36.
DEFAULT_QUANTITIES: dict[str, tuple[str, ...]] = {
    "so101": ("goal_position", "position", "load", "velocity", "voltage", "temperature", "position_error"),
    "omx": ("goal_position", "position", "aperture", "current", "velocity", "voltage", "temperature",
            "position_error"),
    "panda": ("goal_position", "position", "velocity", "torque", "position_error"),
}
STANDARD_QUANTITIES = {
    "goal_position": "rad, the commanded (leader) joint position",
    "position": "rad, measured joint position",
    "position_error": "rad, goal_position - position",
    "velocity": "rad/s, measured joint velocity",
    "load": "signed duty fraction -1..1 (servo PWM/load register)",
    "current": "A, motor current",
    "voltage": "V, supply voltage at the servo",
    "temperature": "deg C, servo temperature",
}
# Definitions of the non-standard quantities a spec may use (written to the model metadata).
EXTRA_QUANTITIES = {
    "aperture": "mm, OpenManipulator-X gripper opening as recorded by NAD (derived from the gripper motor position)",
    "goal_aperture": "mm, commanded OpenManipulator-X gripper opening",
    "torque": "N.m, measured link-side joint torque (Franka torque sensors)",
}
SCALAR_QUANTITIES = {"aperture", "goal_aperture"}  # one column, named after the gripper joint
ANGLE_QUANTITIES = {"goal_position", "position", "position_error"}
ANGLE_STD_FLOOR = 0.05  # rad, the reference's floor for the angle groups
RAW_STD_FLOOR = 1.0  # the reference's floor for every other group, in NAD file units (one count)


class FeatureError(ValueError):
    """A telemetry sample or metadata does not fit the feature spec."""


@dataclass(frozen=True, eq=False)
class FeatureSpec:
    """Which telemetry quantities, in which order, with which history and normalization."""

    robot: str
    joint_names: tuple[str, ...]
    quantities: tuple[str, ...]
    history: int
    dt: float
    mean: np.ndarray  # float32 [F], physical units
    std: np.ndarray  # float32 [F]

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", np.asarray(self.mean, dtype=np.float32).reshape(-1))
        object.__setattr__(self, "std", np.asarray(self.std, dtype=np.float32).reshape(-1))
        n = len(self.feature_names)
        if self.mean.shape != (n,) or self.std.shape != (n,):
            raise FeatureError(f"mean/std have {self.mean.shape}/{self.std.shape} entries, the spec has {n} features")
        if not (np.all(np.isfinite(self.std)) and np.all(self.std > 0) and np.all(np.isfinite(self.mean))):
            raise FeatureError("feature std must be finite and > 0, mean finite")
        if self.history < 0:
            raise FeatureError(f"history must be >= 0, got {self.history}")

    @property
    def n_joints(self) -> int:
        return len(self.joint_names)

    @cached_property
    def n_features(self) -> int:
        return len(self.feature_names)

    @property
    def window_length(self) -> int:
        return self.history + 1

    def quantity_width(self, quantity: str) -> int:
        return 1 if quantity in SCALAR_QUANTITIES else self.n_joints

    @cached_property
    def feature_names(self) -> tuple[str, ...]:
        """One name per input column: "<quantity>/<joint>" (scalar gripper quantities use the last joint)."""
        names: list[str] = []
        for q in self.quantities:
            joints = self.joint_names[-1:] if q in SCALAR_QUANTITIES else self.joint_names
            names.extend(f"{q}/{j}" for j in joints)
        return tuple(names)

    @property
    def feature_definitions(self) -> dict[str, str]:
        """Unit/meaning of every quantity the spec uses that is not one of the architecture's standard ones."""
        return {q: EXTRA_QUANTITIES.get(q, "undocumented") for q in self.quantities if q not in STANDARD_QUANTITIES}

    @property
    def required_quantities(self) -> tuple[str, ...]:
        """Telemetry quantities a sample must carry (position_error is computed)."""
        needed: list[str] = []
        for q in self.quantities:
            for src in (("goal_position", "position") if q == "position_error" else (q,)):
                if src not in needed:
                    needed.append(src)
        return tuple(needed)

    # ------------------------------------------------------------------ building frames and windows

    def _column(self, values: Mapping[str, np.ndarray], quantity: str, rows: int | None) -> np.ndarray:
        """[rows, width] float64 (rows None: one sample -> [width])."""
        if quantity == "position_error":
            return self._column(values, "goal_position", rows) - self._column(values, "position", rows)
        if quantity not in values:
            raise FeatureError(f"telemetry lacks {quantity!r} (the {self.robot} model needs {self.required_quantities})")
        arr = np.asarray(values[quantity], dtype=np.float64)
        width = self.quantity_width(quantity)
        shape = (width,) if rows is None else (rows, width)
        if arr.size != (width if rows is None else rows * width):
            raise FeatureError(f"{quantity!r} has shape {arr.shape}, expected {shape}")
        return arr.reshape(shape)

    @cached_property
    def _slices(self) -> tuple[tuple[str, slice], ...]:
        out, start = [], 0
        for q in self.quantities:
            width = self.quantity_width(q)
            out.append((q, slice(start, start + width)))
            start += width
        return tuple(out)

    def quantity_slice(self, quantity: str) -> slice:
        """Columns of ``quantity`` in a frame (e.g. to swap in simulated position/velocity during a rollout)."""
        for q, where in self._slices:
            if q == quantity:
                return where
        raise FeatureError(f"the {self.robot} feature spec has no quantity {quantity!r} (has {self.quantities})")

    def frame(self, sample: Mapping[str, np.ndarray]) -> np.ndarray:
        """One telemetry sample (quantity -> [n_joints] physical units) -> float32 [F].

        Same float64 arithmetic as ``frames`` (position_error = goal - position), then one cast to float32.
        """
        out = np.empty(self.n_features, dtype=np.float64)
        for q, where in self._slices:
            out[where] = self._column(sample, q, None)
        return out.astype(np.float32)

    def frames(self, traj: Trajectory) -> np.ndarray:
        """All rows of a trajectory -> float32 [T, F] (same arithmetic as ``frame``, row by row)."""
        rows = len(traj.time)
        return np.concatenate([self._column(traj.quantities, q, rows) for q in self.quantities], axis=1).astype(
            np.float32
        )

    def windows(self, frames: np.ndarray) -> np.ndarray:
        """[T, F] -> [T, history+1, F]: window t holds frames t-history..t, oldest first; before row 0 the
        mean frame stands in (zero after normalization)."""
        frames = np.asarray(frames, dtype=np.float32)
        if frames.ndim != 2 or frames.shape[1] != self.n_features:
            raise FeatureError(f"frames must be [T, {self.n_features}], got {frames.shape}")
        padded = np.concatenate([np.broadcast_to(self.mean, (self.history, self.n_features)), frames], axis=0)
        view = np.lib.stride_tricks.sliding_window_view(padded, self.window_length, axis=0)  # [T, F, H+1]
        return np.ascontiguousarray(view.transpose(0, 2, 1))

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """(x - mean) / std, clipped to +-10, float32 (what the exported graph does first)."""
        out = (np.asarray(x, dtype=np.float32) - self.mean) / self.std
        return np.clip(out, -CLIP, CLIP)

    # ------------------------------------------------------------------ metadata

    def to_metadata(self) -> dict[str, str]:
        """ONNX metadata_props entries (JSON values) that rebuild this spec."""
        return {
            "robot": json.dumps(self.robot),
            "joint_names": json.dumps(list(self.joint_names)),
            "feature_names": json.dumps(list(self.feature_names)),
            "quantities": json.dumps(list(self.quantities)),
            "history": json.dumps(self.history),
            "dt": json.dumps(self.dt),
            "feature_mean": json.dumps([float(v) for v in self.mean]),
            "feature_std": json.dumps([float(v) for v in self.std]),
            "feature_definitions": json.dumps(self.feature_definitions),
        }

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> FeatureSpec:
        """Rebuild a spec from ``to_metadata`` entries; FeatureError says which entry is missing or wrong."""
        def get(key: str):
            if key not in meta:
                raise FeatureError(f"model metadata lacks {key!r}")
            try:
                return json.loads(meta[key])
            except (TypeError, json.JSONDecodeError) as exc:
                raise FeatureError(f"model metadata {key!r} is not JSON: {exc}") from None

        joint_names = tuple(get("joint_names"))
        feature_names = tuple(get("feature_names"))
        quantities = tuple(get("quantities")) if "quantities" in meta else _quantities_from_names(feature_names)
        spec = cls(
            robot=str(get("robot")),
            joint_names=joint_names,
            quantities=quantities,
            history=int(get("history")),
            dt=float(get("dt")),
            mean=np.asarray(get("feature_mean"), dtype=np.float32),
            std=np.asarray(get("feature_std"), dtype=np.float32),
        )
        if spec.feature_names != feature_names:
            raise FeatureError(
                f"feature_names in the metadata do not follow quantities x joints: {feature_names[:4]}... vs "
                f"{spec.feature_names[:4]}..."
            )
        return spec


def _quantities_from_names(names: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for name in names:
        q = name.split("/", 1)[0]
        if q not in out:
            out.append(q)
    return tuple(out)


def std_floors(robot: str, quantities: Sequence[str], joint_names: Sequence[str]) -> np.ndarray:
    """Per-feature std floors in physical units: the reference's raw-unit floors (0.05 for angle groups,
    1.0 NAD file unit for the others) times the NAD file->physical scale of each quantity."""
    schema = schema_for(robot)
    floors: list[float] = []
    for q in quantities:
        if q in ANGLE_QUANTITIES:
            floor = ANGLE_STD_FLOOR
        else:
            try:
                floor = RAW_STD_FLOOR * schema.group(q).scale
            except KeyError:
                floor = RAW_STD_FLOOR
        width = 1 if q in SCALAR_QUANTITIES else len(joint_names)
        floors.extend([floor] * width)
    return np.asarray(floors, dtype=np.float32)


def default_spec(robot: str, history: int = DEFAULT_HISTORY, quantities: Sequence[str] | None = None) -> FeatureSpec:
    """The method's features for ``robot`` with identity normalization (fit it with ``fit_normalization``)."""
    if quantities is None and robot not in DEFAULT_QUANTITIES:
        raise FeatureError(f"no default features for robot {robot!r} (known: {', '.join(DEFAULT_QUANTITIES)})")
    table = load_robot(robot)
    quantities = tuple(quantities or DEFAULT_QUANTITIES[robot])
    n = sum(1 if q in SCALAR_QUANTITIES else table.n_joints for q in quantities)
    return FeatureSpec(
        robot=robot,
        joint_names=table.joint_names,
        quantities=quantities,
        history=history,
        dt=table.data_dt,
        mean=np.zeros(n, dtype=np.float32),
        std=np.ones(n, dtype=np.float32),
    )


def fit_normalization(spec: FeatureSpec, frames: Sequence[np.ndarray]) -> FeatureSpec:
    """Spec with mean/std over all rows of ``frames`` (list of [T, F]), std floored per quantity."""
    if not frames:
        raise FeatureError("fit_normalization needs at least one trajectory's frames")
    stacked = np.concatenate([np.asarray(f, dtype=np.float64) for f in frames], axis=0)
    if stacked.shape[1] != spec.n_features:
        raise FeatureError(f"frames have {stacked.shape[1]} features, the spec {spec.n_features}")
    mean = np.nanmean(stacked, axis=0)
    std = np.nanstd(stacked, axis=0)
    floors = std_floors(spec.robot, spec.quantities, spec.joint_names)
    std = np.maximum(np.nan_to_num(std, nan=0.0), floors)
    return replace(spec, mean=mean.astype(np.float32), std=std.astype(np.float32))


def next_row_targets(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(input rows 0..T-2, targets = rows 1..T-1): the window ending at row i predicts row i+1."""
    return np.arange(len(values) - 1), np.asarray(values)[1:]


class HistoryWindow:
    """The runtime's rolling window: push one frame per telemetry sample, get [history+1, F] back.

    Starts (and restarts after ``reset``) filled with the mean frame, so its windows are bit-identical
    to ``spec.windows(spec.frames(traj))`` for the same rows.
    """

    def __init__(self, spec: FeatureSpec) -> None:
        self.spec = spec
        self._buffer = np.empty((spec.window_length, spec.n_features), dtype=np.float32)
        self.filled = 0
        self.reset()

    def reset(self) -> None:
        self._buffer[:] = self.spec.mean
        self.filled = 0

    def push(self, frame: np.ndarray) -> np.ndarray:
        """Append ``frame`` [F] as the newest row; returns a copy of the window, oldest first."""
        frame = np.asarray(frame, dtype=np.float32)
        if frame.shape != (self.spec.n_features,):
            raise FeatureError(f"frame must have shape ({self.spec.n_features},), got {frame.shape}")
        self._buffer[:-1] = self._buffer[1:]
        self._buffer[-1] = frame
        self.filled = min(self.filled + 1, self.spec.window_length)
        return self._buffer.copy()


def benchmark(spec: FeatureSpec, traj: Trajectory, repeats: int = 3) -> dict[str, float]:
    """Per-sample cost of the runtime path (frame + HistoryWindow.push) and per-row cost of the batch path."""
    import time

    samples = [{q: v[i] for q, v in traj.quantities.items()} for i in range(len(traj))]
    best_online = best_batch = float("inf")
    for _ in range(repeats):
        window = HistoryWindow(spec)
        start = time.perf_counter()
        for sample in samples:
            window.push(spec.frame(sample))
        best_online = min(best_online, (time.perf_counter() - start) / len(samples))
        start = time.perf_counter()
        spec.normalize(spec.windows(spec.frames(traj)))
        best_batch = min(best_batch, (time.perf_counter() - start) / len(samples))
    return {"online_us_per_sample": 1e6 * best_online, "batch_us_per_row": 1e6 * best_batch}


def main(argv: list[str] | None = None) -> int:
    """``python -m na_inference.features ROOT``: the feature table of a robot and the cost of both paths."""
    import argparse
    import sys

    from .nad import find_trajectories, load_trajectory

    parser = argparse.ArgumentParser(prog="python -m na_inference.features",
                                     description="Fit the default features on NAD files and time the runtime "
                                                 "(per-sample) and training (batch) paths.")
    parser.add_argument("root", help="NAD folder")
    parser.add_argument("--robot", default="so101", choices=sorted(DEFAULT_QUANTITIES))
    args = parser.parse_args(argv)
    try:
        trajs = [load_trajectory(p, args.robot) for p in find_trajectories(args.root, args.robot)]
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    spec = default_spec(args.robot)
    spec = fit_normalization(spec, [spec.frames(t) for t in trajs])
    print(f"{args.robot}: {spec.n_features} features x {spec.window_length} tokens, fitted on {len(trajs)} files")
    print(f"{'feature':28s} {'mean':>10s} {'std':>10s}")
    for name, m, s in zip(spec.feature_names, spec.mean, spec.std):
        print(f"{name:28s} {m:10.4f} {s:10.4f}")
    timing = benchmark(spec, trajs[0])
    print(f"runtime path (frame + HistoryWindow.push): {timing['online_us_per_sample']:.1f} us/sample; "
          f"batch path (frames + windows + normalize): {timing['batch_us_per_row']:.2f} us/row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
