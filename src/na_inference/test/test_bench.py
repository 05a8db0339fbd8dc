"""na-bench runs end to end on a small model and reports what it measured (function, not speed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from na_inference.bench import export_random_model
from na_inference.features import default_spec
from na_inference.model import ModelConfig, NeuralActuatorNet, count_parameters

pytestmark = pytest.mark.ros


def test_bench_measures_per_step_and_end_to_end(tmp_path):
    # na-bench times torch eager against ONNX Runtime, so it needs a real exported network (small preset).
    models = tmp_path / "models"
    models.mkdir()
    export_random_model(models, "so101", "small")
    spec = default_spec("so101")
    exported_parameters = count_parameters(NeuralActuatorNet(ModelConfig.preset("small", spec.n_features,
                                                                                spec.n_joints)))
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "na_inference.bench", "--models", str(models), "--steps", "200", "--warmup", "20", "--paced-steps", "20",
         "--seconds", "2", "--rate", "500", "--json", str(out)],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(a) per-step latency" in result.stdout and "(b) end to end" in result.stdout
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000  # latency distributions plotted next to the JSON
    (step,) = report["per_step"]
    # the eager network was rebuilt with the ONNX model's architecture: same parameter count
    assert step["parameters"] == exported_parameters
    for key in ("engine_step", "onnxruntime", "torch_eager"):
        assert step[key]["n"] == 200 and 0 < step[key]["p50_ms"] <= step[key]["p99_ms"] <= step[key]["max_ms"]
    assert step["torch_over_ort_p50"] > 0
    assert step["onnxruntime_at_model_rate"]["n"] == 20
    e2e = report["end_to_end"]
    assert e2e["published"] > 500
    assert 0 <= e2e["input_drops"] <= e2e["published"]
    assert e2e["received_outputs"] > 0 and e2e["stamp_to_receipt"]["p50_ms"] > 0
    assert e2e["node_outputs"] >= e2e["received_outputs"]
    assert e2e["node_rate_handling"] == "decimated"  # 500 Hz telemetry onto a 62.3 Hz model
