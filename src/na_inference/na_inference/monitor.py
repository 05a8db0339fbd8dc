"""Health of the inference runtime as diagnostic statuses (pure Python: the node turns them into
diagnostic_msgs; tests check them without ROS).

Four statuses per report: the model (loaded or why not), the input stream (rate against the model
dt, staleness, bad samples since the last report), inference latency percentiles, and the motor
condition per joint. Levels follow diagnostic_msgs: OK 0, WARN 1, ERROR 2, STALE 3.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from na_inference.engine import EngineOutput, LatencyStats, SampleStatus, StepResult

OK, WARN, ERROR, STALE = 0, 1, 2, 3


@dataclass
class Status:
    """One diagnostic_msgs/DiagnosticStatus, without ROS."""

    name: str
    level: int
    message: str
    values: dict[str, str] = field(default_factory=dict)


class RuntimeMonitor:
    """Collects what happened between two reports and summarises it as ``Status`` entries."""

    def __init__(self, name: str, joint_names: Sequence[str], model_dt: float | None,
                 condition_threshold: float = 0.5, stale_timeout: float = 0.5) -> None:
        self.name = name
        self.joint_names = tuple(joint_names)
        self.model_dt = model_dt
        self.condition_threshold = condition_threshold
        self.stale_timeout = stale_timeout
        self.model_status = Status(f"{name}: model", ERROR, "no model loaded")
        self.inference_latency = LatencyStats()
        self.callback_latency = LatencyStats()
        self.input_delay = LatencyStats()   # receipt wall time - header stamp (meaningful for wall-clock stamps)
        self._stamps = np.zeros(256)     # stamps of recent valid samples, for the input rate
        self._n_stamps = 0
        self._events: Counter[str] = Counter()
        self._details: dict[str, str] = {}
        self._last_receipt: float | None = None
        self._last_output: EngineOutput | None = None
        self._warming_up = False
        self.total_samples = 0
        self.total_outputs = 0

    # ------------------------------------------------------------------ inputs

    def model_loaded(self, path: str, values: dict[str, str]) -> None:
        self.model_status = Status(f"{self.name}: model", OK, f"model loaded: {path}", values)

    def model_failed(self, path: str, reason: str) -> None:
        self.model_status = Status(f"{self.name}: model", ERROR, f"model not loaded ({path}): {reason}",
                                   {"path": path})

    def record(self, receipt_time: float, stamp: float, result: StepResult) -> None:
        """One telemetry sample and what the engine did with it (``receipt_time`` monotonic s)."""
        self.total_samples += 1
        self._last_receipt = receipt_time
        status = result.status
        if result.reset_reason is not None:
            self._n_stamps = 0      # the rate is measured within one continuous stream
        if status in (SampleStatus.INFERRED, SampleStatus.DECIMATED):
            self._stamps[self._n_stamps % self._stamps.size] = stamp
            self._n_stamps += 1
        else:
            self._events[status.value] += 1
            self._details[status.value] = result.detail
        if result.reset_reason is not None and result.reset_reason != "start":
            self._events["reset"] += 1
            self._details["reset"] = result.reset_reason
        if result.output is not None:
            self.total_outputs += 1
            self._last_output = result.output
            self._warming_up = result.output.warming_up
            self.inference_latency.add(result.output.latency_s)
            if result.output.grid_steps > 1:
                self._events["resampled"] += 1

    def record_rejected(self, receipt_time: float, kind: SampleStatus, detail: str) -> None:
        """A message the node could not turn into a sample (e.g. missing joints)."""
        self.total_samples += 1
        self._last_receipt = receipt_time
        self._events[kind.value] += 1
        self._details[kind.value] = detail

    def record_internal_error(self, receipt_time: float, detail: str) -> None:
        """An exception while handling a sample (a bug): ERROR until a period passes without one."""
        self.total_samples += 1
        self._last_receipt = receipt_time
        self._events["internal_error"] += 1
        self._details["internal_error"] = detail

    def record_ignored(self, receipt_time: float) -> None:
        """A message received while no model is loaded."""
        self.total_samples += 1
        self._last_receipt = receipt_time

    # ------------------------------------------------------------------ report

    def input_rate(self) -> float:
        """Mean rate (Hz) over the recent valid stamps; NaN with fewer than two."""
        n = min(self._n_stamps, self._stamps.size)
        if n < 2:
            return float("nan")
        recent = np.sort(self._stamps[:n]) if self._n_stamps > self._stamps.size else self._stamps[:n]
        span = recent[-1] - recent[0]
        return (n - 1) / span if span > 0 else float("nan")

    def report(self, now: float) -> list[Status]:
        """Statuses for this period (``now`` monotonic s); clears the per-period counts."""
        statuses = [self.model_status, self._input_status(now), self._latency_status(), self._condition_status()]
        self._events.clear()
        self._details.clear()
        self.inference_latency.clear()
        self.callback_latency.clear()
        self.input_delay.clear()
        return statuses

    def _input_status(self, now: float) -> Status:
        rate = self.input_rate()
        values = {"samples_total": str(self.total_samples), "outputs_total": str(self.total_outputs),
                  "input_rate_hz": f"{rate:.1f}"}
        if self.model_dt:
            model_rate = 1.0 / self.model_dt
            values["model_rate_hz"] = f"{model_rate:.2f}"
            if np.isfinite(rate):
                mode = "decimated" if rate > model_rate * 1.05 else ("resampled" if rate < model_rate * 0.95
                                                                      else "on rate")
                values["rate_handling"] = mode
        for key, count in sorted(self._events.items()):
            values[f"{key}_count"] = str(count)
            if key in self._details:
                values[f"{key}_last"] = self._details[key]
        staleness = float("inf") if self._last_receipt is None else now - self._last_receipt
        values["staleness_s"] = f"{staleness:.3f}"
        d50, d99 = (v * 1e3 for v in self.input_delay.percentiles(50, 99))
        values["input_delay_p50_ms"], values["input_delay_p99_ms"] = f"{d50:.3f}", f"{d99:.3f}"
        problems: list[tuple[int, str]] = []
        if self._events["internal_error"]:
            problems.append((ERROR, f"{self._events['internal_error']} samples failed with an internal error: "
                                    f"{self._details['internal_error']}"))
        if self._events[SampleStatus.MISSING_JOINTS.value]:
            problems.append((ERROR, f"{self._events[SampleStatus.MISSING_JOINTS.value]} samples dropped: "
                                    f"{self._details[SampleStatus.MISSING_JOINTS.value]}"))
        if self._events[SampleStatus.NON_FINITE.value]:
            problems.append((WARN, f"{self._events[SampleStatus.NON_FINITE.value]} samples dropped: "
                                   f"{self._details[SampleStatus.NON_FINITE.value]} (NaN/inf)"))
        if self._events[SampleStatus.OUT_OF_ORDER.value]:
            problems.append((WARN, f"{self._events[SampleStatus.OUT_OF_ORDER.value]} samples dropped, "
                                   f"out-of-order stamps: {self._details[SampleStatus.OUT_OF_ORDER.value]}"))
        if self._events["reset"]:
            problems.append((WARN, f"history reset: {self._details['reset']}"))
        if self._last_receipt is None:
            problems.append((WARN, "no telemetry received yet"))
        elif staleness > self.stale_timeout:
            problems.append((WARN, f"telemetry stale: nothing for {staleness:.2f} s"))
        elif self._warming_up:
            problems.append((WARN, "history warming up (start-up padding with the mean frame)"))
        if not problems:
            mode = values.get("rate_handling", "")
            return Status(f"{self.name}: input", OK, f"input {rate:.1f} Hz, model "
                          f"{values.get('model_rate_hz', '?')} Hz ({mode})", values)
        level = max(level for level, _ in problems)
        return Status(f"{self.name}: input", level, "; ".join(message for _, message in problems), values)

    def _latency_status(self) -> Status:
        p50, p99, pmax = (v * 1e3 for v in self.inference_latency.percentiles(50, 99, 100))
        c50, c99 = (v * 1e3 for v in self.callback_latency.percentiles(50, 99))
        values = {"inference_p50_ms": f"{p50:.3f}", "inference_p99_ms": f"{p99:.3f}",
                  "inference_max_ms": f"{pmax:.3f}", "inferences": str(len(self.inference_latency)),
                  "callback_p50_ms": f"{c50:.3f}", "callback_p99_ms": f"{c99:.3f}"}
        if len(self.inference_latency) == 0:
            return Status(f"{self.name}: inference", OK, "no inference in this period", values)
        level = WARN if self.model_dt and p99 * 1e-3 > self.model_dt else OK
        return Status(f"{self.name}: inference", level, f"latency p50 {p50:.3f} ms, p99 {p99:.3f} ms", values)

    def _condition_status(self) -> Status:
        out = self._last_output
        if out is None:
            return Status(f"{self.name}: motor condition", OK, "no estimate yet")
        values = {joint: f"{score:.3f}" for joint, score in zip(self.joint_names, out.condition)}
        degraded = [j for j, s in zip(self.joint_names, out.condition) if s < self.condition_threshold]
        if degraded:
            return Status(f"{self.name}: motor condition", WARN, f"degraded: {', '.join(degraded)}", values)
        return Status(f"{self.name}: motor condition", OK, "all joints normal", values)
