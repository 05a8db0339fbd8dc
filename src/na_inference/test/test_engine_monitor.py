"""Diagnostics of the runtime (pure Python): each kind of bad input gives its level and message."""

from __future__ import annotations

import numpy as np

from na_inference.engine import EngineOutput, SampleStatus, StepResult
from na_inference.monitor import ERROR, OK, WARN, RuntimeMonitor

JOINTS = ("a", "b", "c")
DT = 0.01


def output(stamp: float, condition=(0.9, 0.9, 0.9), warming_up=False) -> EngineOutput:
    return EngineOutput(stamp=stamp, torque=np.zeros(3), force=np.zeros(3), force_raw=np.zeros(3),
                        contact_probability=0.1, condition=np.array(condition), warming_up=warming_up,
                        grid_steps=1, latency_s=2e-4)


def steady(monitor: RuntimeMonitor, n: int = 20, start: float = 0.0, condition=(0.9, 0.9, 0.9)) -> float:
    for i in range(n):
        stamp = start + i * DT
        monitor.record(stamp, stamp, StepResult(SampleStatus.INFERRED, output(stamp, condition)))
    return start + n * DT


def by_name(statuses) -> dict:
    return {s.name.split(": ", 1)[1]: s for s in statuses}


def test_steady_input_is_ok_and_reports_rate_and_latency():
    monitor = RuntimeMonitor("n", JOINTS, DT)
    monitor.model_loaded("m.onnx", {})
    now = steady(monitor)
    report = by_name(monitor.report(now))
    assert report["model"].level == OK
    assert report["input"].level == OK and "on rate" in report["input"].message
    assert float(report["input"].values["input_rate_hz"]) == np.float64(100.0).round(1)
    assert report["inference"].values["inference_p50_ms"] == "0.200"
    assert report["motor condition"].level == OK


def test_each_bad_input_has_its_level_and_the_next_period_is_clean_again():
    monitor = RuntimeMonitor("n", JOINTS, DT)
    now = steady(monitor)
    monitor.record(now, now, StepResult(SampleStatus.NON_FINITE, detail="non-finite load at b"))
    assert by_name(monitor.report(now))["input"].level == WARN
    monitor.record_rejected(now, SampleStatus.MISSING_JOINTS, "joints missing from the message: c")
    monitor.record(now, now - DT, StepResult(SampleStatus.OUT_OF_ORDER, detail="stamp 10.0 ms older"))
    status = by_name(monitor.report(now))["input"]
    assert status.level == ERROR
    assert "joints missing from the message: c" in status.message and "out-of-order" in status.message
    assert status.values["missing_joints_count"] == "1"
    later = now + 1.0
    monitor.record(later, later, StepResult(SampleStatus.INFERRED, output(later, warming_up=True),
                                            reset_reason="gap of 1.000 s (> 0.050 s)"))
    status = by_name(monitor.report(later))["input"]
    assert status.level == WARN and "history reset: gap of 1.000 s" in status.message
    end = steady(monitor, start=later + DT)
    assert by_name(monitor.report(end))["input"].level == OK


def test_stale_and_missing_telemetry_warn():
    monitor = RuntimeMonitor("n", JOINTS, DT, stale_timeout=0.5)
    assert "no telemetry received yet" in by_name(monitor.report(0.0))["input"].message
    now = steady(monitor)
    status = by_name(monitor.report(now + 2.0))["input"]
    assert status.level == WARN and "stale" in status.message


def test_failed_model_is_an_error_and_degraded_joints_warn():
    monitor = RuntimeMonitor("n", JOINTS, DT, condition_threshold=0.5)
    monitor.model_failed("x.onnx", "model is for robot omx, this node drives so101")
    now = steady(monitor, condition=(0.9, 0.2, 0.95))
    report = by_name(monitor.report(now))
    assert report["model"].level == ERROR and "omx" in report["model"].message
    assert report["motor condition"].level == WARN and report["motor condition"].message == "degraded: b"


def test_internal_error_is_an_error_until_a_clean_period():
    monitor = RuntimeMonitor("n", JOINTS, DT)
    now = steady(monitor)
    monitor.record_internal_error(now, "ValueError('boom')")
    status = by_name(monitor.report(now))["input"]
    assert status.level == ERROR and "internal error" in status.message and "boom" in status.message
    assert by_name(monitor.report(steady(monitor, start=now)))["input"].level == OK
