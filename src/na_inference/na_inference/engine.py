"""The run-time inference engine: an ONNX model, its metadata and a telemetry history, no ROS, no torch.

One call per telemetry sample (``InferenceEngine.step``). The engine

* loads the model file and checks it against the model contract and the robot table at start
  (a wrong or corrupt file raises ``ModelContractError`` with a message that says what is wrong);
* keeps the history the model was trained with (``HistoryWindow`` of the shared feature pipeline,
  start-up padded with the mean frame) on the model's own time grid ``t0 + k * dt``:
  telemetry faster than ``dt`` is decimated, slower or irregular telemetry is resampled, both by
  linear interpolation between the two samples around each grid time, so the model never sees frames
  at a spacing it was not trained on;
* runs one inference when a sample completes at least one grid step (so at most one per sample, at
  the model rate on average), stamped with that sample's stamp;
* rejects bad samples without crashing: non-finite values and missing joints are dropped, stamps
  that go backwards (or repeat) are dropped, a gap longer than ``max_gap_dt`` model steps or a clock
  that jumps back further than that resets the history (outputs then say ``warming_up``);
* when the robot table has a ``payload_observer`` (``payload.py``), feeds it every accepted sample:
  while the gripper carries a lifted object, the published z force is the observer's weight from the
  physics of the motion (the network's estimate is its prior) and the contact probability is 1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np
import onnxruntime as ort

from na_description.robot_table import RobotTable, load_robot
from na_inference.contract import (
    INPUT_NAME,
    OUTPUT_NAMES,
    ModelContractError,
    ModelMetadata,
    check_io,
    read_metadata,
    validate_for_robot,
)
from na_inference.features import FeatureSpec, HistoryWindow
from na_inference.nad import GRIPPER_APERTURE_KEY, gripper_aperture_mm
from na_inference.payload import GRAVITY, PayloadObserver

# A sample within this fraction of dt of a grid time completes it (float stamps near 1.7e9 s carry only
# ~0.24 us of resolution, so exact comparison would miss grid points at random).
GRID_TOLERANCE = 1e-3
# Below this gate the gated force carries no usable direction: force_raw is reported as NaN.
MIN_GATE_FOR_RAW_FORCE = 1e-30


class ModelFileError(ModelContractError):
    """The model file is missing or is not a loadable ONNX model."""


class SampleStatus(Enum):
    """What the engine did with one telemetry sample."""

    INFERRED = "inferred"            # completed a grid step: one inference, output attached
    DECIMATED = "decimated"          # valid, but no grid step completed yet (telemetry faster than dt)
    NON_FINITE = "non_finite"        # NaN/inf in a quantity the model needs: dropped
    MISSING_JOINTS = "missing_joints"  # a joint or quantity the model needs is absent: dropped
    OUT_OF_ORDER = "out_of_order"    # stamp not after the last accepted one: dropped


@dataclass
class EngineOutput:
    """The model's estimate for one telemetry sample, in physical units."""

    stamp: float                    # s, stamp of the telemetry sample that completed this step
    torque: np.ndarray              # [n_joints] N.m
    force: np.ndarray               # [3] N, gated (force_raw * contact_probability)
    force_raw: np.ndarray           # [3] N, before gating (NaN when the gate is ~0)
    contact_probability: float      # 0..1
    condition: np.ndarray           # [n_joints] 1 normal .. 0 degraded
    warming_up: bool                # part of the history is still start-up padding (mean frame)
    grid_steps: int                 # model steps this sample completed (> 1: slower input was resampled)
    latency_s: float                # wall time of the ONNX Runtime call
    payload_kg: float | None = None  # the payload observer's mass while it sees a carry (force z = -g m)


@dataclass
class StepResult:
    status: SampleStatus
    output: EngineOutput | None = None
    reset_reason: str | None = None  # set when this sample restarted the history
    detail: str = ""                 # why a sample was dropped, for logs and diagnostics


@dataclass
class EngineCounters:
    """Sample counts since start (diagnostics and benchmarks read them)."""

    samples: int = 0
    inferences: int = 0
    decimated: int = 0
    non_finite: int = 0
    missing_joints: int = 0
    out_of_order: int = 0
    resets: int = 0
    resampled_steps: int = 0    # grid steps filled in between two samples (input slower than dt)


class JointMismatchError(ValueError):
    """A telemetry message lacks joints (or values) the model needs."""


def select_joints(names: Sequence[str], arrays: Mapping[str, Sequence[float]],
                  joint_names: Sequence[str], quantities: Sequence[str]) -> dict[str, np.ndarray]:
    """Reorder per-joint arrays of a message (``names`` order) into the model's joint order.

    Raises ``JointMismatchError`` naming what is missing: a joint absent from ``names``, or a
    quantity array shorter than ``names``.
    """
    index = {name: i for i, name in enumerate(names)}
    missing = [j for j in joint_names if j not in index]
    if missing:
        raise JointMismatchError(f"joints missing from the message: {', '.join(missing)}")
    order = np.fromiter((index[j] for j in joint_names), dtype=np.intp, count=len(joint_names))
    sample: dict[str, np.ndarray] = {}
    for quantity in quantities:
        values = np.asarray(arrays.get(quantity, ()), dtype=np.float64)
        if values.shape != (len(names),):
            raise JointMismatchError(
                f"{quantity} has {values.size} values for {len(names)} joint names")
        sample[quantity] = values[order]
    return sample


# Quantities a model may use that servo telemetry does not carry: name -> source quantity. The OMX's NAD
# "aperture" (mm) is a function of the gripper motor angle (nad.gripper_aperture_mm, as na-record writes it).
DERIVED_FROM_GRIPPER = {"aperture": "position", "goal_aperture": "goal_position"}


def derived_telemetry(robot: RobotTable, sample: Mapping[str, np.ndarray],
                      quantities: Sequence[str]) -> dict[str, np.ndarray]:
    """The ``quantities`` that can be computed from ``sample`` with the robot table (others are left out,
    so the engine reports them missing). Values are [1] arrays for the scalar gripper quantities."""
    derived: dict[str, np.ndarray] = {}
    if GRIPPER_APERTURE_KEY not in robot.raw.get("data", {}) or robot.gripper_joint is None:
        return derived
    for quantity in quantities:
        source = DERIVED_FROM_GRIPPER.get(quantity)
        if source is None or source not in sample:
            continue
        angle = np.asarray(sample[source], dtype=np.float64)[robot.joint_index(robot.gripper_joint)]
        derived[quantity] = np.array([gripper_aperture_mm(robot.name, angle)])
    return derived


def repo_root() -> Path | None:
    """The source checkout this module runs from (editable installs), if any."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "src" / "na_inference").is_dir() and (parent / "models").is_dir():
            return parent
    return None


def resolve_model_path(robot: RobotTable, override: str | os.PathLike | None = None) -> Path:
    """Where the model file is: ``override`` if given, else the robot table's ``model.file``
    (e.g. ``models/so101.onnx``) looked up in the source checkout, then in
    ``<prefix>/share/na_inference/`` for every prefix of ``AMENT_PREFIX_PATH`` (installed package).
    Returns the first candidate that exists, else the checkout path (so the error names it)."""
    if override:
        return Path(override).expanduser()
    rel = Path(robot.model_file)
    candidates: list[Path] = []
    root = repo_root()
    if root is not None:
        candidates.append(root / rel)
    for prefix in filter(None, os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep)):
        candidates.append(Path(prefix) / "share" / "na_inference" / rel)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return candidates[0] if candidates else rel


def session_options(threads: int = 1) -> ort.SessionOptions:
    """ONNX Runtime options for lowest single-sample latency on a shared CPU."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0" if threads == 1 else "1")
    options.log_severity_level = 3
    return options


class OnnxModel:
    """An ONNX model checked against the contract, with a preallocated input and IO binding."""

    def __init__(self, path: str | os.PathLike, robot: RobotTable | None = None, threads: int = 1) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"model file {self.path} does not exist")
        try:
            self.session = ort.InferenceSession(str(self.path), sess_options=session_options(threads),
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises several exception types for unreadable files
            raise ModelFileError(f"{self.path} is not a loadable ONNX model: {exc}") from exc
        self.metadata: ModelMetadata = read_metadata(self.session.get_modelmeta().custom_metadata_map)
        if robot is not None:  # the robot first: "made for another robot" is the most useful message
            validate_for_robot(self.metadata, robot)
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        check_io(self.metadata, [i.name for i in inputs], inputs[0].shape if inputs else [],
                 [o.name for o in outputs], {o.name: o.shape for o in outputs})
        self.spec: FeatureSpec = self.metadata.feature_spec
        tokens, n_features = self.spec.window_length, self.spec.n_features
        self.input = np.zeros((1, tokens, n_features), dtype=np.float32)
        n_joints = len(self.metadata.joint_names)
        shapes = {"torque": (1, n_joints), "force": (1, 3), "contact_probability": (1, 1),
                  "condition": (1, n_joints)}
        self.outputs = {name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()}
        self._binding = self.session.io_binding()
        self._binding.bind_cpu_input(INPUT_NAME, self.input)
        for name, array in self.outputs.items():
            self._binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)

    def run(self, window: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """One forward pass on ``window`` [history+1, F] physical units (or on ``self.input`` as
        filled by the caller). Returns the preallocated output arrays (overwritten by the next call)."""
        if window is not None:
            self.input[0] = window
        self.session.run_with_iobinding(self._binding)
        return self.outputs

    def run_batch(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        """Forward pass on [B, history+1, F] (offline evaluation and tests; allocates)."""
        names = list(OUTPUT_NAMES)
        values = self.session.run(names, {INPUT_NAME: np.ascontiguousarray(windows, dtype=np.float32)})
        return dict(zip(names, values))


class InferenceEngine:
    """Telemetry samples in, model estimates out, on the model's time grid (see module docstring)."""

    def __init__(self, model_path: str | os.PathLike, robot: str | RobotTable, *,
                 max_gap_dt: float = 5.0, threads: int = 1,
                 payload_observer: bool | PayloadObserver = True) -> None:
        self.robot = load_robot(robot) if isinstance(robot, str) else robot
        self.model = OnnxModel(model_path, self.robot, threads=threads)
        self.spec = self.model.spec
        self.metadata = self.model.metadata
        self.joint_names: tuple[str, ...] = tuple(self.metadata.joint_names)
        self.dt = float(self.spec.dt)
        self.max_gap_s = max_gap_dt * self.dt
        self.quantities = self.spec.required_quantities
        self.window = HistoryWindow(self.spec)
        self.counters = EngineCounters()
        self._last_stamp: float | None = None
        self._last_frame: np.ndarray | None = None
        self._grid_origin = 0.0
        self._grid_index = 0            # next grid time is origin + index * dt
        self.payload_observer, self.payload_observer_status = self._make_observer(payload_observer)
        self._last_force_z = 0.0        # the network's last z force: the observer's prior

    #: what the payload observer reads of each sample
    OBSERVER_QUANTITIES = ("position", "goal_position", "velocity", "load")

    def _make_observer(self, wanted: bool | PayloadObserver) -> tuple[PayloadObserver | None, str]:
        """(observer or None, why: for logs and diagnostics)."""
        if wanted is False:
            return None, "off (disabled)"
        if tuple(self.joint_names) != tuple(self.robot.joint_names):
            return None, "off (the model's joints are not the robot table's)"
        missing = [q for q in self.OBSERVER_QUANTITIES if q not in self.quantities]
        if missing:
            return None, f"off (the model does not read {', '.join(missing)})"
        observer = wanted if isinstance(wanted, PayloadObserver) else PayloadObserver.for_robot(self.robot)
        if observer is None:
            return None, f"off (the {self.robot.name} robot table has no payload_observer)"
        return observer, "on"

    @property
    def tokens(self) -> int:
        return self.spec.history + 1

    def reset(self) -> None:
        """Forget the history (next sample starts a new grid, padded with the mean frame)."""
        self.window.reset()
        self._last_stamp = None
        self._last_frame = None
        if self.payload_observer is not None:
            self.payload_observer.reset()

    def check_sample(self, sample: Mapping[str, np.ndarray]) -> tuple[SampleStatus, str] | None:
        """Why ``sample`` cannot be used, as (MISSING_JOINTS or NON_FINITE, detail), or None if it can."""
        for quantity in self.quantities:
            values = sample.get(quantity)
            if values is None:
                return SampleStatus.MISSING_JOINTS, f"missing quantity {quantity}"
            try:
                values = np.asarray(values, dtype=np.float64)
            except (TypeError, ValueError):
                return SampleStatus.NON_FINITE, f"{quantity} is not numeric"
            width = self.spec.quantity_width(quantity)
            if values.shape != (width,):
                return SampleStatus.MISSING_JOINTS, f"{quantity} has shape {values.shape}, expected ({width},)"
            finite = np.isfinite(values)
            if not finite.all():
                joints = self.joint_names if width == len(self.joint_names) else self.joint_names[-width:]
                bad = [joints[i] for i in np.flatnonzero(~finite)]
                return SampleStatus.NON_FINITE, f"non-finite {quantity} at {', '.join(bad)}"
        return None

    def step(self, stamp: float, sample: Mapping[str, np.ndarray]) -> StepResult:
        """Feed one telemetry sample (physical units, model joint order) stamped ``stamp`` seconds."""
        counters = self.counters
        counters.samples += 1
        problem = self.check_sample(sample)
        if problem is not None:
            return self._drop(*problem)
        if not np.isfinite(stamp):
            return self._drop(SampleStatus.OUT_OF_ORDER, f"non-finite stamp {stamp}")

        reset_reason = None
        if self._last_stamp is None:
            reset_reason = "start" if counters.inferences == 0 and counters.resets == 0 else "restart"
        elif stamp <= self._last_stamp:
            back = self._last_stamp - stamp
            if back <= self.max_gap_s:
                what = "repeated" if back == 0 else f"{back * 1e3:.1f} ms older than the last sample"
                return self._drop(SampleStatus.OUT_OF_ORDER, f"stamp {what}")
            reset_reason = f"clock jumped back {back:.3f} s"
        elif stamp - self._last_stamp > self.max_gap_s:
            reset_reason = f"gap of {stamp - self._last_stamp:.3f} s (> {self.max_gap_s:.3f} s)"

        frame = self.spec.frame(sample)
        if reset_reason is not None:
            counters.resets += 1
            self.window.reset()
            if self.payload_observer is not None:
                self.payload_observer.reset()
            self._grid_origin, self._grid_index = stamp, 0
            self._last_stamp, self._last_frame = stamp, frame
            window, steps = self._push_grid(stamp, frame)
        else:
            window, steps = self._push_grid(stamp, frame)
            self._last_stamp, self._last_frame = stamp, frame
        if steps == 0:
            counters.decimated += 1
            self._observe(stamp, sample)
            return StepResult(SampleStatus.DECIMATED, reset_reason=reset_reason)
        counters.resampled_steps += steps - 1
        output = self._infer(stamp, window, steps)
        self._last_force_z = float(output.force[2])
        payload = self._observe(stamp, sample)
        if payload is not None:
            output.force = np.array([output.force[0], output.force[1], -GRAVITY * payload])
            output.force_raw = output.force.copy()
            output.contact_probability = 1.0
            output.payload_kg = payload
        return StepResult(SampleStatus.INFERRED, output, reset_reason)

    def _observe(self, stamp: float, sample: Mapping[str, np.ndarray]) -> float | None:
        """Feed the payload observer; the carried mass (kg) while it sees a carry, else None."""
        if self.payload_observer is None:
            return None
        estimate = self.payload_observer.update(
            stamp, *(np.asarray(sample[q], dtype=np.float64) for q in self.OBSERVER_QUANTITIES),
            prior_kg=max(0.0, -self._last_force_z / GRAVITY))
        return estimate.mass_kg if estimate.carrying else None

    def _push_grid(self, stamp: float, frame: np.ndarray) -> tuple[np.ndarray | None, int]:
        """Push the frames of every grid time in (last stamp, stamp], linearly interpolated."""
        window, steps = None, 0
        tolerance = GRID_TOLERANCE * self.dt
        t_prev, f_prev = self._last_stamp, self._last_frame
        while True:
            grid_time = self._grid_origin + self._grid_index * self.dt
            if grid_time > stamp + tolerance:
                break
            if grid_time >= stamp - tolerance or t_prev is None or t_prev >= stamp:
                grid_frame = frame
            else:
                weight = (grid_time - t_prev) / (stamp - t_prev)
                grid_frame = f_prev + (frame - f_prev) * weight
            window = self.window.push(grid_frame)
            self._grid_index += 1
            steps += 1
        return window, steps

    def _infer(self, stamp: float, window: np.ndarray, steps: int) -> EngineOutput:
        start = time.perf_counter()
        out = self.model.run(window)
        latency = time.perf_counter() - start
        self.counters.inferences += 1
        gate = float(out["contact_probability"][0, 0])
        force = out["force"][0].astype(np.float64)
        force_raw = force / gate if gate > MIN_GATE_FOR_RAW_FORCE else np.full(3, np.nan)
        return EngineOutput(
            stamp=stamp,
            torque=out["torque"][0].astype(np.float64),
            force=force,
            force_raw=force_raw,
            contact_probability=gate,
            condition=out["condition"][0].astype(np.float64),
            warming_up=self.window.filled < self.tokens,
            grid_steps=steps,
            latency_s=latency,
        )

    def _drop(self, status: SampleStatus, detail: str) -> StepResult:
        counter = {SampleStatus.NON_FINITE: "non_finite", SampleStatus.MISSING_JOINTS: "missing_joints",
                   SampleStatus.OUT_OF_ORDER: "out_of_order"}[status]
        setattr(self.counters, counter, getattr(self.counters, counter) + 1)
        return StepResult(status, detail=detail)


class LatencyStats:
    """Percentiles over the last ``capacity`` latencies (a fixed ring, no allocation per sample)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._values = np.zeros(capacity)
        self._count = 0

    def add(self, seconds: float) -> None:
        self._values[self._count % self._values.size] = seconds
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, self._values.size)

    def percentiles(self, *q: float) -> tuple[float, ...]:
        """Percentiles in seconds (NaN when empty)."""
        if len(self) == 0:
            return tuple(float("nan") for _ in q)
        return tuple(float(v) for v in np.percentile(self._values[: len(self)], q))

    def clear(self) -> None:
        self._count = 0
