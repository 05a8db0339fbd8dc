"""``na-bringup ROBOT [--sim]``: the robot's stack in one process, for installs without ``ros2 launch``.

It composes the same nodes as the launch file (``na_bringup.stack``) with the same parameter YAML
and shuts down cleanly on Ctrl-C/SIGTERM: nodes closed (the
driver turns torque off and closes its bus), the simulated arm's process ended by its PID.

Threads: the driver's bus loop runs on its own thread; the ROS callbacks of all nodes run on rclpy's
EventsExecutor. rclpy's MultiThreadedExecutor was measured here to starve the bus thread of the GIL: the
SO-101 driver reached 17 Hz of its 100 Hz beside the inference node, against 100 Hz with the events
executor (na-bringup so101 --sim, driver diagnostics).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from na_bringup.stack import DRIVER, STACKS, NodeSpec, nodes_of, params_file, sim_command, sim_link

SIM_START_TIMEOUT_S = 60.0


@dataclass
class StackOptions:
    stack: str
    sim: bool = False
    port: str | None = None
    model: str | None = None
    rate_hz: float | None = None
    scenario: str | None = None
    sim_args: list[str] = field(default_factory=list)


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class SimulatedBus:
    """The simulated arm behind its emulated bus, as a child process (its own GIL and core)."""

    def __init__(self, cmd: list[str], link: Path) -> None:
        self.link = link
        # Own process group: a Ctrl-C in the terminal reaches only na-bringup, which then turns the
        # torque off through the still-running bus before ending the simulator. PDEATHSIG ends the
        # simulator if na-bringup itself is killed, so it never outlives us.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        self.device = self._read_device_path()

    def _read_device_path(self) -> str:
        deadline = time.monotonic() + SIM_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"na-sim-bus exited with {self.proc.returncode}: {self.proc.stdout.read()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline().strip()
                if line.startswith("/"):
                    threading.Thread(target=self._drain, daemon=True).start()
                    return line
        self.close()
        raise RuntimeError(f"na-sim-bus did not report its device within {SIM_START_TIMEOUT_S:.0f} s")

    def _drain(self) -> None:
        for line in self.proc.stdout:
            print(f"[na-sim-bus] {line.rstrip()}", flush=True)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _override_file(options: StackOptions, port: str | None) -> dict:
    overrides: dict[str, dict] = {}
    for spec in nodes_of(options.stack):
        params = {}
        if spec is DRIVER and port:
            params["port"] = port
        if spec is DRIVER and options.rate_hz:
            params["rate_hz"] = float(options.rate_hz)
        if spec.package == "na_inference" and options.model:
            params["model_path"] = str(Path(options.model).resolve())
        if params:
            overrides[spec.name] = {"ros__parameters": params}
    return overrides


@contextlib.contextmanager
def running_stack(options: StackOptions, extra_nodes: Sequence[Callable[[], object]] = ()) -> Iterator[dict]:
    """Start the stack (and the simulated arm with --sim); yields {"nodes", "executor", "sim"}.

    Everything started here is stopped on exit, in reverse order, whatever happened."""
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from na_inference.node import make_executor

    sim = None
    nodes: list = []
    executor = None
    with tempfile.TemporaryDirectory(prefix="na_bringup_") as tmp:
        try:
            port = options.port
            if options.sim:
                link = sim_link(options.stack)
                sim = SimulatedBus(sim_command(options.stack, link, options.scenario, options.sim_args), link)
                port = str(link)
            override_path = Path(tmp) / "overrides.yaml"
            override_path.write_text(yaml.safe_dump(_override_file(options, port)))
            # Signals are ours (stop_event_on_signals): the nodes must close (torque off) while the
            # ROS context is still valid, so rclpy must not shut it down first on Ctrl-C.
            rclpy.init(args=["na-bringup", "--ros-args", "--params-file", str(params_file(options.stack)),
                             "--params-file", str(override_path)],
                       signal_handler_options=SignalHandlerOptions.NO)
            for spec in nodes_of(options.stack):
                nodes.append(_make_node(spec))
            for factory in extra_nodes:
                nodes.append(factory())
            executor = make_executor()
            for node in nodes:
                executor.add_node(node)
            yield {"nodes": nodes, "executor": executor, "sim": sim}
        finally:
            for node in reversed(nodes):    # stop the nodes' own threads first (driver: torque off)
                close = getattr(node, "close", None)
                if callable(close):
                    close()
            if executor is not None:
                executor.shutdown(timeout_sec=2.0)
            for node in reversed(nodes):
                node.destroy_node()
            with contextlib.suppress(Exception):
                rclpy.try_shutdown()
            if sim is not None:
                sim.close()


def _make_node(spec: NodeSpec):
    try:
        return spec.node_class()()
    except SystemExit as exc:       # the nodes exit with a clear message on bad parameters
        raise RuntimeError(f"{spec.name} did not start: {exc}") from None


def spin_until(executor, stop: threading.Event, duration_s: float | None = None,
               every_second: Callable[[], None] | None = None) -> None:
    """Spin until ``stop`` is set, rclpy shuts down, or ``duration_s`` passes."""
    import rclpy

    start = time.monotonic()
    next_tick = start + 1.0
    while not stop.is_set() and rclpy.ok():
        executor.spin_once(timeout_sec=0.05)
        now = time.monotonic()
        if every_second is not None and now >= next_tick:
            next_tick += 1.0
            every_second()
        if duration_s is not None and now - start >= duration_s:
            break


def stop_event_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="na-bringup",
        description="Run a robot's NeuralActuator stack (driver + inference node) in one process with the "
                    "same parameter YAML as `ros2 launch na_bringup <robot>.launch.py`. Ctrl-C stops it "
                    "cleanly (torque off, bus closed, simulator ended).")
    parser.add_argument("robot", choices=sorted(STACKS), help="which stack (franka = Panda via franka_ros2)")
    parser.add_argument("--sim", action="store_true", help="start a simulated arm behind an emulated servo bus")
    parser.add_argument("--port", help="servo bus device (default: the YAML's)")
    parser.add_argument("--model", help="ONNX model file (default: the robot table's)")
    parser.add_argument("--rate", type=float, help="driver rate in Hz (default: the YAML's)")
    parser.add_argument("--scenario", default=None, help="simulated scenario (with --sim), e.g. pick_and_place")
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.sim and args.port:
        build_parser().error("--port and --sim exclude each other (the simulator provides the port)")
    options = StackOptions(args.robot, sim=args.sim, port=args.port, model=args.model, rate_hz=args.rate,
                           scenario=args.scenario)
    stop = stop_event_on_signals()
    try:
        with running_stack(options) as stack:
            names = ", ".join(n.get_name() for n in stack["nodes"])
            where = f"simulated bus {stack['sim'].device}" if stack["sim"] else (args.port or "the YAML's port")
            print(f"na-bringup {args.robot}: running {names} on {where} (pid {os.getpid()}); Ctrl-C to stop",
                  flush=True)
            spin_until(stack["executor"], stop, args.duration)
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        print(f"na-bringup: {exc}", flush=True)
        return 1
    print("na-bringup: stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
