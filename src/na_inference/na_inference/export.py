"""ONNX export through torch's dynamo exporter, following the model contract of architecture.md.

The exported graph is ``DeployableModel``: physical-unit telemetry [batch, history+1, F] in, the four
contract outputs out, normalization inside; the metadata (feature spec, robot, force frame, training
summary, metrics) goes into metadata_props as JSON values. Every export ends with a parity check of
ONNX Runtime against the torch model; a model that fails it is not written.

    na-export --checkpoint runs/so101/best.pt --out models/so101.onnx
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from na_description.robot_table import RobotTableError, load_robot

from .contract import INPUT_NAME, OUTPUT_NAMES, build_metadata, metadata_from_session, validate_for_robot
from .features import FeatureSpec
from .model import DeployableModel, NeuralActuatorNet, load_checkpoint

PARITY_TOLERANCE = 1e-4  # max abs difference ONNX Runtime vs torch eager, any output
OPSET = 18


class ExportError(RuntimeError):
    """The exporter failed, or the exported graph does not match the torch model."""


@dataclass
class ExportReport:
    path: Path
    max_abs_diff: dict[str, float]
    parity_batch_sizes: tuple[int, ...]
    n_parameters: int
    file_bytes: int

    def summary(self) -> str:
        worst = max(self.max_abs_diff.values())
        return (f"wrote {self.path} ({self.file_bytes / 1e6:.2f} MB, {self.n_parameters} parameters); "
                f"ORT vs torch max abs diff {worst:.2e} over batch sizes {list(self.parity_batch_sizes)}")


def parity_inputs(spec: FeatureSpec, batch: int, seed: int = 0) -> np.ndarray:
    """Telemetry around the training distribution (mean +- 3 std, some beyond the clip) for parity checks."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 3.0, size=(batch, spec.window_length, spec.n_features)).astype(np.float32)
    return (spec.mean + z * spec.std).astype(np.float32)


def check_parity(model: DeployableModel, onnx_path: str | Path, spec: FeatureSpec,
                 batch_sizes: tuple[int, ...] = (1, 7), threads: int = 1) -> dict[str, float]:
    """Max abs difference per output between ONNX Runtime and the torch model on the same inputs."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    worst = dict.fromkeys(OUTPUT_NAMES, 0.0)
    model = model.eval()
    for i, batch in enumerate(batch_sizes):
        telemetry = parity_inputs(spec, batch, seed=i)
        with torch.no_grad():
            expected = [t.numpy() for t in model(torch.from_numpy(telemetry))]
        got = session.run(list(OUTPUT_NAMES), {INPUT_NAME: telemetry})
        for name, e, g in zip(OUTPUT_NAMES, expected, got):
            if g.shape != e.shape:
                raise ExportError(f"output {name}: ONNX shape {g.shape} != torch shape {e.shape} at batch {batch}")
            worst[name] = max(worst[name], float(np.max(np.abs(g - e))))
    return worst


def export_onnx(net: NeuralActuatorNet, spec: FeatureSpec, path: str | Path, metadata: Mapping[str, Any] | None = None,
                force_frame: str | None = None, tolerance: float = PARITY_TOLERANCE,
                parity_batch_sizes: tuple[int, ...] = (1, 7)) -> ExportReport:
    """Export ``net`` + ``spec`` to ONNX at ``path`` with the contract metadata; parity-checked.

    ``metadata`` holds the free entries (training_data, metrics, ...); the contract entries come from
    ``spec`` and the robot table (force frame). Raises ExportError, leaving no file, if parity fails.
    """
    path = Path(path)
    if force_frame is None:
        try:
            force_frame = load_robot(spec.robot).force_frame
        except RobotTableError as exc:
            raise ExportError(f"cannot find the force frame of robot {spec.robot!r}: {exc}") from None
    props = build_metadata(spec, force_frame, metadata)
    model = DeployableModel(net, spec).eval()
    example = torch.from_numpy(parity_inputs(spec, 2))
    batch = torch.export.Dim("batch", min=1, max=65536)
    # The exporter warns about optional torchvision ops it cannot register; irrelevant here.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter chatter (deprecations inside torch) is not ours to fix
        try:
            program = torch.onnx.export(
                model, (example,), dynamo=True, input_names=[INPUT_NAME], output_names=list(OUTPUT_NAMES),
                dynamic_shapes={"telemetry": {0: batch}}, opset_version=OPSET, verbose=False,
                optimize=True,
            )
        except Exception as exc:  # the dynamo exporter raises many types; report it as one
            raise ExportError(f"torch dynamo ONNX export failed: {exc}") from exc
    proto = program.model_proto
    del proto.metadata_props[:]
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.doc_string = f"NeuralActuator model for {spec.robot}: input {INPUT_NAME} [batch, {spec.window_length}, " \
                       f"{spec.n_features}] physical units; outputs {', '.join(OUTPUT_NAMES)}"
    onnx.checker.check_model(proto)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        onnx.save_model(proto, str(tmp))
        diffs = check_parity(model, tmp, spec, parity_batch_sizes)
        worst = max(diffs.values())
        if not np.isfinite(worst) or worst > tolerance:
            raise ExportError(f"ONNX Runtime differs from torch by {worst:.3e} (> {tolerance:g}): {diffs}")
        session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        metadata_from_session(session)  # the file reads back under the contract
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return ExportReport(path=path, max_abs_diff=diffs, parity_batch_sizes=tuple(parity_batch_sizes),
                        n_parameters=sum(p.numel() for p in net.parameters()), file_bytes=path.stat().st_size)


def benchmark(model: DeployableModel, onnx_path: str | Path, spec: FeatureSpec, runs: int = 2000,
              threads: int = 1) -> dict[str, float]:
    """Batch-1 latency (ms) of ONNX Runtime and of torch eager, both on ``threads`` threads."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    telemetry = parity_inputs(spec, 1)
    feed = {INPUT_NAME: telemetry}

    def timed(fn, n: int) -> np.ndarray:
        for _ in range(max(n // 10, 10)):
            fn()
        out = np.empty(n)
        for i in range(n):
            start = time.perf_counter()
            fn()
            out[i] = time.perf_counter() - start
        return 1e3 * out

    ort_ms = timed(lambda: session.run(None, feed), runs)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.from_numpy(telemetry)
        with torch.no_grad():
            torch_ms = timed(lambda: model(x), max(runs // 4, 50))
    finally:
        torch.set_num_threads(previous)
    return {"ort_p50_ms": float(np.median(ort_ms)), "ort_p99_ms": float(np.percentile(ort_ms, 99)),
            "torch_p50_ms": float(np.median(torch_ms)), "runs": runs, "threads": threads}


def checkpoint_metadata(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The free metadata entries a checkpoint's ``extra`` contributes (JSON-serializable ones only)."""
    out: dict[str, Any] = {}
    for key in ("training_data", "metrics", "training", "model_card", "preset"):
        if key in extra:
            try:
                json.dumps(extra[key])
            except TypeError:
                continue
            out[key] = extra[key]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="na-export",
        description="Export a NeuralActuator checkpoint to ONNX (torch dynamo exporter) with the model "
                    "contract metadata, and check ONNX Runtime against torch.")
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint written by na-train")
    parser.add_argument("--out", required=True, type=Path, help="ONNX file to write, e.g. models/so101.onnx")
    parser.add_argument("--robot", help="refuse to export unless the checkpoint is for this robot")
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=JSON",
                        help="extra metadata entry (JSON value), e.g. metrics='{\"force_mae_n\": 0.08}'")
    parser.add_argument("--tolerance", type=float, default=PARITY_TOLERANCE,
                        help=f"max abs ORT-vs-torch difference allowed (default {PARITY_TOLERANCE:g})")
    parser.add_argument("--bench", type=int, default=0, metavar="RUNS",
                        help="after exporting, time RUNS batch-1 inferences (ORT and torch eager, 1 thread)")
    args = parser.parse_args(argv)
    try:
        net, _config, spec, extra = load_checkpoint(args.checkpoint)
        if args.robot:
            from .contract import read_metadata

            validate_for_robot(read_metadata(build_metadata(spec, "")), load_robot(args.robot))
        metadata = checkpoint_metadata(extra)
        for item in args.metadata:
            key, sep, value = item.partition("=")
            if not sep or not key:
                parser.error(f"--metadata needs KEY=JSON, got {item!r}")
            try:
                metadata[key] = json.loads(value)
            except json.JSONDecodeError:
                metadata[key] = value
        report = export_onnx(net.eval(), spec, args.out, metadata, tolerance=args.tolerance)
    except (FileNotFoundError, ValueError, ExportError, RobotTableError) as exc:
        print(f"na-export: error: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    for name, diff in report.max_abs_diff.items():
        print(f"  {name:20s} max abs diff {diff:.2e}")
    if args.bench > 0:
        timing = benchmark(DeployableModel(net, spec).eval(), args.out, spec, args.bench)
        print(f"batch 1, 1 thread, {args.bench} runs: ONNX Runtime p50 {timing['ort_p50_ms']:.3f} ms, "
              f"p99 {timing['ort_p99_ms']:.3f} ms; torch eager p50 {timing['torch_p50_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
