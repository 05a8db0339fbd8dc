"""``na-bench``: how fast the runtime is, measured, not assumed.

(a) Per-step latency on one thread for every model in ``models/`` (and a freshly exported
    reference-size model with random weights when none is shipped, or with ``--reference``): the
    full engine step (feature frame + history + ONNX Runtime), ONNX Runtime alone, and torch eager of
    the same network in the same run, with the ratio. Torch is imported here only, lazily.
(b) End to end over DDS: one process publishes ``ActuatorState`` at ``--rate`` Hz stamped with the
    wall clock, ``inference_node`` runs in another, and this process subscribes ``/external_wrench``
    and measures receipt time minus stamp, and counts what was lost on each hop.

    na-bench                      # both, ~1 min
    na-bench --skip-e2e --steps 5000
    na-bench --json results/bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from na_description.robot_table import load_robot
from na_inference.contract import read_model_file
from na_inference.engine import InferenceEngine, repo_root
from na_inference.node import make_executor

PERCENTILES = (50, 99, 100)


STEP_BUDGET_MS = 0.5  # the per-step goal of issue 6 (p99)


def _stats_ms(seconds: list[float] | np.ndarray) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    p50, p99, pmax = np.percentile(ms, PERCENTILES)
    return {"p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(pmax), "n": len(seconds),
            "share_within_budget": float(np.mean(ms <= STEP_BUDGET_MS))}


def plausible_sample(engine: InferenceEngine, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A telemetry sample around the model's training statistics (mean + noise * std)."""
    spec = engine.spec
    names = spec.feature_names
    sample = {}
    for quantity in engine.quantities:
        width = spec.quantity_width(quantity)
        joints = spec.joint_names[-1:] if width == 1 else spec.joint_names
        columns = [names.index(f"{quantity}/{j}") for j in joints if f"{quantity}/{j}" in names]
        if len(columns) == width:
            sample[quantity] = spec.mean[columns] + 0.5 * spec.std[columns] * rng.standard_normal(width)
        else:  # only needed for a derived feature (e.g. goal_position for position_error)
            sample[quantity] = 0.1 * rng.standard_normal(width)
    return sample


# ---------------------------------------------------------------------------------------- (a) per step

def torch_network_for(path: Path, engine: InferenceEngine, checkpoint: Path | None):
    """The torch network of an ONNX file: the checkpoint's if given, else one of the same architecture
    rebuilt from the graph's weight shapes (random weights: latency does not depend on their values)."""
    import onnx
    import torch

    from na_inference.model import DeployableModel, ModelConfig, NeuralActuatorNet, load_checkpoint

    if checkpoint is not None:
        net, _config, spec, _extra = load_checkpoint(checkpoint)
        return DeployableModel(net.eval(), spec).eval(), "checkpoint weights"
    shapes = {init.name: list(init.dims) for init in onnx.load(str(path), load_external_data=False).graph.initializer}
    spec = engine.spec
    extra = engine.metadata.extra
    if isinstance(extra.get("model_config"), dict):
        config = ModelConfig.from_dict({**extra["model_config"], "n_features": spec.n_features,
                                        "n_joints": spec.n_joints})
        source = "metadata model_config"
    else:
        def hidden(head: str) -> tuple[int, ...]:
            biases = sorted((int(k.split(".")[2]), v[0]) for k, v in shapes.items()
                            if k.startswith(f"net.{head}.") and k.endswith(".bias"))
            return tuple(size for _, size in biases[:-1])

        layers = {int(k.split(".")[2]) for k in shapes if k.startswith("net.layers.")}
        preset = extra.get("preset") if isinstance(extra.get("preset"), str) else None
        heads = int(extra.get("n_heads", 0)) or ModelConfig.preset(preset or "reference", 1, 1).n_heads
        config = ModelConfig(n_features=spec.n_features, n_joints=spec.n_joints, history=spec.history,
                             d_model=shapes["net.position"][1], n_heads=heads, n_layers=len(layers),
                             d_ff=shapes["net.layers.0.ff.0.bias"][0], torque_hidden=hidden("torque_head"),
                             force_hidden=hidden("force_head"), condition_hidden=hidden("condition_head"))
        source = "architecture from the ONNX weight shapes, random weights"
    torch.manual_seed(0)
    net = NeuralActuatorNet(config).eval()
    return DeployableModel(net, spec).eval(), source


def bench_model(path: Path, steps: int, warmup: int, checkpoint: Path | None = None,
                paced_steps: int = 300) -> dict[str, Any]:
    """Per-step latency of one model: engine step, ORT alone, torch eager (same run, one thread each),
    back to back; then ORT once per model dt (sleeping in between), as the node runs it, where other
    processes have evicted the caches between two steps."""
    import torch

    torch.set_num_threads(1)
    robot = read_model_file(path).robot
    engine = InferenceEngine(path, robot)
    rng = np.random.default_rng(0)
    samples = [plausible_sample(engine, rng) for _ in range(64)]
    engine_s, ort_s = [], []
    for i in tqdm(range(warmup + steps), desc=f"engine {path.name}", leave=False):
        start = time.perf_counter()
        out = engine.step(i * engine.dt, samples[i % len(samples)]).output
        elapsed = time.perf_counter() - start
        if i >= warmup:
            engine_s.append(elapsed)
            ort_s.append(out.latency_s)
    paced_s = []
    for i in tqdm(range(paced_steps), desc=f"paced {path.name}", leave=False):
        out = engine.step((warmup + steps + i) * engine.dt, samples[i % len(samples)]).output
        paced_s.append(out.latency_s)
        time.sleep(engine.dt)
    window = engine.model.input.copy()
    model, source = torch_network_for(path, engine, checkpoint)
    x = torch.from_numpy(window)
    torch_s = []
    with torch.inference_mode():
        for i in tqdm(range(warmup + steps), desc=f"torch {path.name}", leave=False):
            start = time.perf_counter()
            model(x)
            if i >= warmup:
                torch_s.append(time.perf_counter() - start)
    n_params = sum(p.numel() for p in model.net.parameters())
    result = {"model": str(path), "robot": robot, "parameters": n_params, "torch_network": source,
              "engine_step": _stats_ms(engine_s), "onnxruntime": _stats_ms(ort_s), "torch_eager": _stats_ms(torch_s)}
    result["torch_over_ort_p50"] = result["torch_eager"]["p50_ms"] / result["onnxruntime"]["p50_ms"]
    result["torch_over_ort_p99"] = result["torch_eager"]["p99_ms"] / result["onnxruntime"]["p99_ms"]
    result["_samples_ms"] = {"engine_step": np.asarray(engine_s) * 1e3, "onnxruntime": np.asarray(ort_s) * 1e3,
                             "torch_eager": np.asarray(torch_s) * 1e3}  # for the plot, not the JSON
    if paced_s:
        result["onnxruntime_at_model_rate"] = _stats_ms(paced_s)
        result["_samples_ms"]["onnxruntime at model rate"] = np.asarray(paced_s) * 1e3
    return result


def export_random_model(folder: Path, robot: str = "so101", preset: str = "reference") -> Path:
    """A ``preset``-size network with random weights, exported through the project's exporter."""
    import torch

    from na_inference.export import export_onnx
    from na_inference.features import default_spec
    from na_inference.model import ModelConfig, NeuralActuatorNet

    spec = default_spec(robot)
    torch.manual_seed(0)
    net = NeuralActuatorNet(ModelConfig.preset(preset, spec.n_features, spec.n_joints)).eval()
    path = folder / f"{robot}_{preset}_random.onnx"
    export_onnx(net, spec, path, {"training_data": "none (random weights, benchmark only)", "preset": preset})
    return path


# ---------------------------------------------------------------------------------------- (b) end to end

def run_publisher(rate: float, seconds: float, robot: str) -> None:
    """Child process: publish ActuatorState at ``rate`` Hz, stamped with the wall clock at publish time,
    once the node's subscription is matched; print the count as JSON."""
    import rclpy
    from rclpy.qos import qos_profile_sensor_data

    from na_msgs.msg import ActuatorState

    table = load_robot(robot)
    rclpy.init()
    node = rclpy.create_node("na_bench_publisher")
    pub = node.create_publisher(ActuatorState, "/actuator_states", qos_profile_sensor_data)
    deadline = time.monotonic() + 60
    while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    n = table.n_joints
    msg = ActuatorState()
    msg.name = list(table.joint_names)
    msg.hardware_error = [0] * n
    period = 1.0 / rate
    sent, start = 0, time.monotonic()
    next_time = start
    while next_time - start < seconds:
        now = time.monotonic()
        if now < next_time:
            time.sleep(next_time - now)
        phase = 0.5 * sent * period + np.arange(n)
        msg.position = (0.3 * np.sin(phase)).tolist()
        msg.goal_position = (0.3 * np.sin(phase) + 0.01).tolist()
        msg.velocity = (0.15 * np.cos(phase)).tolist()
        msg.load = (0.1 * np.sin(phase)).tolist()
        msg.current = [0.1] * n
        msg.voltage = [12.0] * n
        msg.temperature = [30.0] * n
        wall = time.time_ns()
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(wall, 1_000_000_000)
        pub.publish(msg)
        sent += 1
        next_time += period
    elapsed = time.monotonic() - start
    print(json.dumps({"published": sent, "seconds": elapsed}), flush=True)
    node.destroy_node()
    rclpy.shutdown()


def bench_end_to_end(model: Path, robot: str, rate: float, seconds: float,
                     node_params: list[str] | None = None) -> dict[str, Any]:
    """Publisher process -> inference_node process -> this process; latency and losses per hop."""
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import WrenchStamped
    from rclpy.qos import QoSProfile, qos_profile_sensor_data

    env = dict(os.environ)
    env.setdefault("ROS_DOMAIN_ID", str(1 + os.getpid() % 100))
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")})
    node_proc = subprocess.Popen(
        [sys.executable, "-m", "na_inference.node", "--ros-args", "-p", f"robot:={robot}",
         "-p", f"model_path:={model}", "-p", "diagnostics_period:=0.25",
         *[arg for param in node_params or [] for arg in ("-p", param)]],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pub_proc = None
    rclpy.init()
    node = rclpy.create_node("na_bench_subscriber")
    latencies: list[float] = []
    stamps: list[int] = []
    diagnostics: list[DiagnosticArray] = []

    def on_wrench(msg: WrenchStamped) -> None:
        latencies.append(time.time_ns() - (msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec))
        stamps.append(msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec)

    # sensor-data QoS (best effort) as any consumer would use, with a deep queue so that a stall of this
    # measuring process is not counted as a loss of the node
    wrench_qos = QoSProfile(history=qos_profile_sensor_data.history, depth=1000,
                            reliability=qos_profile_sensor_data.reliability,
                            durability=qos_profile_sensor_data.durability)
    sub = node.create_subscription(WrenchStamped, "/external_wrench", on_wrench, wrench_qos)
    node.create_subscription(DiagnosticArray, "/diagnostics", diagnostics.append, 50)
    executor = make_executor()
    executor.add_node(node)
    try:
        deadline = time.monotonic() + 60
        while (sub.get_publisher_count() == 0 or not diagnostics) and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
        if sub.get_publisher_count() == 0:
            raise RuntimeError("inference_node did not come up within 60 s")
        pub_proc = subprocess.Popen(
            [sys.executable, "-m", "na_inference.bench", "--publisher", "--rate", str(rate),
             "--seconds", str(seconds), "--robot", robot],
            env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
        node_cpu_start = _cpu_seconds(node_proc.pid)
        with tqdm(total=int(seconds), desc="end-to-end", unit="s", leave=False) as bar:
            started = time.monotonic()
            while pub_proc.poll() is None:
                executor.spin_once(timeout_sec=0.01)
                elapsed = min(int(seconds), int(time.monotonic() - started))
                if elapsed > bar.n:
                    bar.update(elapsed - bar.n)
        node_cpu = (_cpu_seconds(node_proc.pid) - node_cpu_start) / (time.monotonic() - started)
        published = json.loads(pub_proc.stdout.read().strip().splitlines()[-1])
        settle = time.monotonic() + 1.0  # let the last outputs and a diagnostics report arrive
        while time.monotonic() < settle:
            executor.spin_once(timeout_sec=0.01)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown()
        for proc in (pub_proc, node_proc):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, 2)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait()
    values = _last_values(diagnostics, ": input")
    received_by_node = int(values.get("samples_total", -1))
    outputs = int(values.get("outputs_total", -1))
    periods = [v for v in _all_values(diagnostics, ": inference") if int(v.get("inferences", "0")) > 0]
    inputs = [v for v in _all_values(diagnostics, ": input") if v.get("input_delay_p50_ms", "nan") != "nan"]

    def over_periods(rows: list[dict[str, str]], key: str, reduce) -> float:
        numbers = [float(r[key]) for r in rows if key in r]
        return float(reduce(numbers)) if numbers else float("nan")
    return {
        "model": str(model), "rate_hz": rate, "seconds": published["seconds"],
        "published": published["published"], "received_by_node": received_by_node,
        "input_drops": published["published"] - received_by_node,
        "node_outputs": outputs, "received_outputs": len(latencies), "output_drops": outputs - len(latencies),
        "stamp_to_receipt": _stats_ms(np.asarray(latencies) * 1e-9) if latencies else {},
        "_samples_ms": np.asarray(latencies) * 1e-6,
        # from the node's /diagnostics, per report period: median of the p50s, worst p99
        "node_inference_ms": {"p50": over_periods(periods, "inference_p50_ms", np.median),
                              "p99": over_periods(periods, "inference_p99_ms", max)},
        "node_callback_ms": {"p50": over_periods(periods, "callback_p50_ms", np.median),
                             "p99": over_periods(periods, "callback_p99_ms", max)},
        "node_input_delay_ms": {"p50": over_periods(inputs, "input_delay_p50_ms", np.median),
                                "p99": over_periods(inputs, "input_delay_p99_ms", max)},
        "node_rate_handling": values.get("rate_handling", ""),
        "node_cpu_fraction": node_cpu,
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), NaN where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _all_values(diagnostics: list, suffix: str) -> list[dict[str, str]]:
    return [{kv.key: kv.value for kv in status.values}
            for array in diagnostics for status in array.status if status.name.endswith(suffix)]


def _last_values(diagnostics: list, suffix: str) -> dict[str, str]:
    for array in reversed(diagnostics):
        for status in array.status:
            if status.name.endswith(suffix):
                return {kv.key: kv.value for kv in status.values}
    return {}


# ---------------------------------------------------------------------------------------- CLI

def shipped_models(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.onnx")) if folder.is_dir() else []


def _without_samples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_samples(v) for k, v in value.items() if k != "_samples_ms"}
    if isinstance(value, list):
        return [_without_samples(v) for v in value]
    return value


def plot_report(report: dict[str, Any], path: Path) -> None:
    """Latency distributions: per-step (engine, ORT, torch) per model, and end-to-end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_step, ax_e2e) = plt.subplots(1, 2, figsize=(12, 4.5))
    for result in report["per_step"]:
        for label, samples in result["_samples_ms"].items():
            values = np.sort(samples)
            ax_step.plot(values, np.arange(1, len(values) + 1) / len(values),
                         label=f"{Path(result['model']).name}: {label}")
    ax_step.axvline(STEP_BUDGET_MS, color="k", linestyle="--", linewidth=0.8, label="0.5 ms goal (p99)")
    ax_step.set(xscale="log", xlabel="per-step latency, ms (batch 1, one thread)", ylabel="fraction of steps",
                title="(a) per step")
    ax_step.legend(fontsize=7)
    e2e = report.get("end_to_end")
    if e2e and len(e2e.get("_samples_ms", [])):
        values = np.sort(e2e["_samples_ms"])
        ax_e2e.plot(values, np.arange(1, len(values) + 1) / len(values),
                    label=f"{Path(e2e['model']).name}, {e2e['rate_hz']:.0f} Hz input")
        ax_e2e.axvline(2.0, color="k", linestyle="--", linewidth=0.8, label="2 ms goal (p99)")
        ax_e2e.legend(fontsize=7)
    ax_e2e.set(xscale="log", xlabel="stamp -> receipt of /external_wrench, ms", ylabel="fraction of outputs",
               title="(b) end to end over DDS")
    fig.suptitle(f"na-bench: {report['machine']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_report(report: dict[str, Any]) -> None:
    print(f"machine: {report['machine']}")
    print("(a) per-step latency, batch 1, one thread (ms)")
    print(f"{'model':34s} {'params':>9s} | {'engine p50':>10s} {'p99':>7s} {'max':>7s} | {'ORT p50':>8s} "
          f"{'p99':>7s} {'<=0.5ms':>7s} | {'torch p50':>9s} {'p99':>7s} | torch/ORT p50")
    for r in report["per_step"]:
        e, o, t = r["engine_step"], r["onnxruntime"], r["torch_eager"]
        print(f"{Path(r['model']).name:34s} {r['parameters']:9d} | {e['p50_ms']:10.3f} {e['p99_ms']:7.3f} "
              f"{e['max_ms']:7.3f} | {o['p50_ms']:8.3f} {o['p99_ms']:7.3f} {100 * o['share_within_budget']:6.1f}% | "
              f"{t['p50_ms']:9.3f} {t['p99_ms']:7.3f} | "
              f"{r['torch_over_ort_p50']:.2f}x")
    for r in report["per_step"]:
        if "onnxruntime_at_model_rate" in r:
            paced = r["onnxruntime_at_model_rate"]
            print(f"{Path(r['model']).name:34s} ORT one step per model dt (as in the node): p50 {paced['p50_ms']:.3f}, "
                  f"p99 {paced['p99_ms']:.3f}, max {paced['max_ms']:.3f} ms, "
                  f"{100 * paced['share_within_budget']:.1f}% within 0.5 ms")
    e2e = report.get("end_to_end")
    if e2e:
        lat = e2e["stamp_to_receipt"]
        print(f"(b) end to end, {Path(e2e['model']).name}, ActuatorState at {e2e['rate_hz']:.0f} Hz for "
              f"{e2e['seconds']:.1f} s ({e2e['node_rate_handling']} onto the model grid); node CPU "
              f"{100 * e2e['node_cpu_fraction']:.0f} % of one core")
        print(f"    published {e2e['published']}, received by node {e2e['received_by_node']} "
              f"(input drops {e2e['input_drops']}); node outputs {e2e['node_outputs']}, received "
              f"{e2e['received_outputs']} (output drops {e2e['output_drops']})")
        if lat:
            print(f"    stamp-to-receipt /external_wrench: p50 {lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms, "
                  f"max {lat['max_ms']:.3f} ms")
        delay, infer, call = e2e["node_input_delay_ms"], e2e["node_inference_ms"], e2e["node_callback_ms"]
        print(f"    in the node: input delay (stamp -> callback) p50 {delay['p50']:.3f} ms, p99 {delay['p99']:.3f} ms; "
              f"callback (all outputs published) p50 {call['p50']:.3f} ms, p99 {call['p99']:.3f} ms, of which "
              f"inference p50 {infer['p50']:.3f} ms, p99 {infer['p99']:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="na-bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    root = repo_root()
    parser.add_argument("--models", type=Path, default=(root / "models") if root else Path("models"),
                        help="folder of shipped .onnx models (default: the checkout's models/)")
    parser.add_argument("--reference", action="store_true",
                        help="also benchmark a freshly exported reference-size model (always when none is shipped)")
    parser.add_argument("--checkpoint", type=Path, help="torch checkpoint of the shipped SO-101 model, for the "
                        "eager comparison with its real weights")
    parser.add_argument("--steps", type=int, default=3000, help="timed steps per model (default 3000)")
    parser.add_argument("--warmup", type=int, default=300, help="untimed warm-up steps (default 300)")
    parser.add_argument("--paced-steps", type=int, default=300,
                        help="ORT steps timed one model dt apart, as in the node (default 300, ~5 s)")
    parser.add_argument("--skip-e2e", action="store_true", help="only the per-step benchmark")
    parser.add_argument("--e2e-only", action="store_true", help="only the end-to-end benchmark")
    parser.add_argument("--rate", type=float, default=1000.0, help="end-to-end publish rate, Hz (default 1000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="end-to-end duration, s (default 10)")
    parser.add_argument("--robot", default="so101", help="robot of the end-to-end run (default so101)")
    parser.add_argument("--node-param", action="append", default=[], metavar="NAME:=VALUE",
                        help="extra inference_node parameter for the end-to-end run (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--publisher", action="store_true", help=argparse.SUPPRESS)  # internal child role
    args = parser.parse_args(argv)
    if args.publisher:
        run_publisher(args.rate, args.seconds, args.robot)
        return 0

    models = shipped_models(args.models)
    with tempfile.TemporaryDirectory(prefix="na_bench_") as tmp:
        if args.reference or not models:
            print("exporting a reference-size model with random weights ...", file=sys.stderr)
            models.append(export_random_model(Path(tmp), args.robot))
        report: dict[str, Any] = {
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
                       f"{', '.join(f'{v:.2f}' for v in os.getloadavg())} at start, python {platform.python_version()}",
            "per_step": [],
        }
        robot_model = load_robot(args.robot).model_file
        for path in [] if args.e2e_only else models:
            checkpoint = args.checkpoint if path.name == Path(robot_model).name else None
            report["per_step"].append(bench_model(path, args.steps, args.warmup, checkpoint, args.paced_steps))
        if not args.skip_e2e:
            candidates = [p for p in models if read_model_file(p).robot == args.robot]
            if candidates:
                report["end_to_end"] = bench_end_to_end(candidates[0], args.robot, args.rate, args.seconds,
                                                        args.node_param)
    print_report(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        png = args.json.with_suffix(".png")
        plot_report(report, png)
        args.json.write_text(json.dumps(_without_samples(report), indent=2))
        print(f"wrote {args.json} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
