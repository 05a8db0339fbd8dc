"""``make demo``: the SO-101 stack against a simulated arm, scored against the simulator's truth.

This process plays the world: the simulated SO-101 (MuJoCo + servo physics) behind its emulated
Feetech bus, the scenario (a pick-and-place with a 300 g payload and one push at the gripper) and the
leader arm that commands it on /joint_commands. The stack itself runs as a user would run it, as a
separate ``na-bringup so101 --port <emulated bus>`` process (driver + inference node). A monitor
subscribes to the node's outputs, prints one status line per second, and at the end writes a plot and
a summary computed from this run only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from na_description.robot_table import load_robot

ROBOT = "so101"
PAYLOAD_KG = 0.300
PUSH_N = np.array([0.0, 0.0, -2.0])   # a 2 N downward push on the gripper (world frame)
G = 9.81


@dataclass
class Timeline:
    """The leader's path and the scenario events, on scenario time (s)."""

    goal: object
    events: list
    duration: float


def demo_timeline(seed: int = 0) -> Timeline:
    """Reach, grasp (300 g attached), lift and carry, hold still while pushed once, place, return."""
    from na_sim.scenarios import Event, grasp_events, gripper_value, home_position, waypoint_path

    robot = load_robot(ROBOT)
    lo, hi = np.asarray(robot.position_min), np.asarray(robot.position_max)
    home = home_position(robot)
    grip = robot.joint_index(robot.gripper_joint)
    open_, closed = gripper_value(robot, "open"), gripper_value(robot, "closed")

    def pose(pan, lift, elbow, wrist, roll, gripper):
        return np.clip(np.array([pan, lift, elbow, wrist, roll, gripper], float), lo, hi)

    start = pose(home[0], home[1], home[2], home[3], home[4], open_)
    pick = pose(0.45, 0.35, 0.25, 0.70, home[4], open_)
    grasp = pick.copy()
    grasp[grip] = closed
    lifted = pose(0.10, -0.20, 0.10, 0.60, home[4], closed)
    place = pose(-0.45, 0.35, 0.25, 0.70, home[4], closed)
    release = place.copy()
    release[grip] = open_
    times = [0.0, 1.0, 3.5, 4.3, 6.8, 12.0, 14.5, 15.3, 18.0]
    poses = [start, start, pick, grasp, lifted, lifted, place, release, start]
    events = [Event(4.0, "payload", PAYLOAD_KG),        # jaws closed on the object
              Event(8.5, "push", PUSH_N), Event(10.0, "push", None),   # one push while holding still
              Event(15.0, "payload", 0.0),              # released on the table
              *grasp_events(robot, 3.5, 15.0)]          # the object stops the jaws from the reach on
    events.sort(key=lambda e: e.time)
    return Timeline(waypoint_path(times, poses), events, 20.0)


@dataclass
class Record:
    """Everything the monitor saw, for the summary and the plot."""

    stamp: list[float] = field(default_factory=list)       # telemetry stamp of each estimate (s)
    latency: list[float] = field(default_factory=list)     # receipt - stamp (s)
    force: list[np.ndarray] = field(default_factory=list)  # gated force (N)
    prob: list[float] = field(default_factory=list)
    truth_t: list[float] = field(default_factory=list)     # wall time of each truth sample (s)
    truth_f: list[np.ndarray] = field(default_factory=list)
    states: int = 0
    diagnostics: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def truth_at(self, t: float) -> np.ndarray:
        """Truth force at wall time ``t`` (the sample at or just after t; the sim samples at 200 Hz)."""
        i = min(bisect_left(self.truth_t, t), len(self.truth_t) - 1)
        return self.truth_f[i]


class World:
    """Simulated arm + emulated bus + scenario events, on the simulator's clock."""

    def __init__(self, timeline: Timeline, link: Path, record: Record) -> None:
        from na_sim.arm import SimulatedArm
        from na_sim.bus.emulator import make_emulator
        from na_sim.scenarios import apply_event

        self.timeline, self.record, self._apply = timeline, record, apply_event
        self.arm = SimulatedArm(ROBOT, seed=0, initial_position=timeline.goal(0.0))
        self.emulator = make_emulator(ROBOT, self.arm, link=str(link))
        self.device = self.emulator.start()
        self.arm.start(rate=1.0)
        self.t0: float | None = None      # sim time at which the scenario starts (leader matched)
        self._fired = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-world", daemon=True)
        self._thread.start()

    def scenario_time(self) -> float | None:
        return None if self.t0 is None else self.arm.time - self.t0

    def begin(self) -> None:
        self.t0 = self.arm.time

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            t = self.scenario_time()
            if t is not None:
                while self._fired < len(self.timeline.events) and self.timeline.events[self._fired].time <= t:
                    self._apply(self.arm, self.timeline.events[self._fired])
                    self._fired += 1
            truth = self.arm.truth()
            with self.record.lock:
                self.record.truth_t.append(time.time())
                self.record.truth_f.append(np.asarray(truth.external_force, float).copy())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.arm.stop()
        self.emulator.stop()


def _monitor_node(world: World, record: Record, joint_names: list[str]):
    """Leader (publishes /joint_commands from the timeline) + monitor (records the node's outputs)."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.node import Node
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import JointState

    from na_msgs.msg import ActuatorState, ExternalForceEstimate

    node = Node("na_demo")
    commands = node.create_publisher(JointState, "/joint_commands", 10)

    def lead() -> None:
        if world.t0 is None:
            if commands.get_subscription_count() == 0 or record.states == 0:
                return                # wait for the driver to match and stream before starting
            world.begin()
        msg = JointState()
        msg.header.stamp = node.get_clock().now().to_msg()
        msg.name = joint_names
        msg.position = [float(v) for v in world.timeline.goal(world.scenario_time())]
        commands.publish(msg)

    def on_force(msg: ExternalForceEstimate) -> None:
        now = time.time()
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        with record.lock:
            record.stamp.append(stamp)
            record.latency.append(now - stamp)
            record.force.append(np.array([msg.force.x, msg.force.y, msg.force.z]))
            record.prob.append(msg.contact_probability)

    def on_state(_msg: ActuatorState) -> None:
        record.states += 1

    def on_diag(msg: DiagnosticArray) -> None:
        for status in msg.status:
            record.diagnostics[status.name] = f"{status.level[0] if isinstance(status.level, bytes) else status.level}:{status.message}"

    node.create_timer(0.02, lead)
    node.create_subscription(ExternalForceEstimate, "/external_force", on_force, qos_profile_sensor_data)
    node.create_subscription(ActuatorState, "/actuator_states", on_state, qos_profile_sensor_data)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    return node


def summarize(record: Record, scenario_start_wall: float | None) -> dict:
    """Force error vs the simulator's truth, contact detection and latency, from this run's samples."""
    with record.lock:
        stamps = np.asarray(record.stamp)
        est = np.asarray(record.force).reshape(-1, 3)
        prob = np.asarray(record.prob)
        latency = np.asarray(record.latency)
        truth = np.asarray([record.truth_at(t) for t in stamps]).reshape(-1, 3) if len(stamps) else est
    if len(stamps) == 0:
        return {"estimates": 0}
    keep = stamps >= (scenario_start_wall or stamps[0])
    err = np.abs(est[keep] - truth[keep])
    in_contact = np.linalg.norm(truth[keep], axis=1) > 0.01
    duration = float(stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return {
        "estimates": int(keep.sum()),
        "output_rate_hz": float((len(stamps) - 1) / duration) if duration > 0 else 0.0,
        "force_mae_n_all_axes": float(err.mean()),
        "force_mae_n_z": float(err[:, 2].mean()),
        "force_mae_n_z_while_holding_or_pushed": float(err[in_contact, 2].mean()) if in_contact.any() else None,
        "contact_accuracy": float(((prob[keep] > 0.5) == in_contact).mean()),
        "latency_ms_p50": float(np.percentile(latency, 50) * 1e3),
        "latency_ms_p99": float(np.percentile(latency, 99) * 1e3),
        "truth": "simulator ground truth: payload weight -m g on z while grasped, push force while pushed",
    }


def plot(record: Record, path: Path, scenario_start_wall: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with record.lock:
        stamps = np.asarray(record.stamp)
        est = np.asarray(record.force).reshape(-1, 3)
        prob = np.asarray(record.prob)
        tt = np.asarray(record.truth_t)
        tf = np.asarray(record.truth_f).reshape(-1, 3)
    t0 = scenario_start_wall or (stamps[0] if len(stamps) else 0.0)
    fig, (ax_f, ax_p) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for axis, color in zip(range(3), ("tab:red", "tab:green", "tab:blue")):
        label = "xyz"[axis]
        ax_f.plot(tt - t0, tf[:, axis], color=color, lw=2.5, alpha=0.35, label=f"truth {label}")
        ax_f.plot(stamps - t0, est[:, axis], color=color, lw=1.0, label=f"estimate {label}")
    ax_f.set_ylabel("external force (N)")
    ax_f.set_title("SO-101 demo: estimated external force (/external_force) vs simulator truth")
    ax_f.legend(ncol=3, fontsize=8, loc="lower left")
    ax_f.grid(alpha=0.3)
    ax_p.plot(stamps - t0, prob, color="k", lw=1.0, label="contact probability")
    truth_contact = np.linalg.norm(tf, axis=1) > 0.01
    ax_p.fill_between(tt - t0, 0, truth_contact.astype(float), color="tab:orange", alpha=0.25,
                      label="truth: payload held / pushed")
    ax_p.set_ylim(-0.05, 1.05)
    ax_p.set_xlabel("scenario time (s)")
    ax_p.set_ylabel("probability")
    ax_p.legend(fontsize=8, loc="upper right")
    ax_p.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def status_line(record: Record, world: World, last: dict) -> str:
    with record.lock:
        n = len(record.stamp)
        new = n - last.get("n", 0)
        last["n"] = n
        force = record.force[-1] if n else np.zeros(3)
        prob = record.prob[-1] if n else float("nan")
        lat = np.asarray(record.latency[-max(new, 1):]) * 1e3 if n else np.array([float("nan")])
    t = world.scenario_time()
    when = f"t={t:5.1f}s" if t is not None else "waiting"
    return (f"[demo] {when}  rate {new:3d} Hz  force ({force[0]:+5.2f}, {force[1]:+5.2f}, {force[2]:+5.2f}) N  "
            f"contact p={prob:4.2f}  latency p50 {np.median(lat):5.2f} ms  payload {world.arm.payload_mass:.2f} kg")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="na-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results") / "demo")
    parser.add_argument("--model", help="ONNX model (default: the robot table's)")
    args = parser.parse_args(argv)

    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from na_bringup.stack import sim_link

    robot = load_robot(ROBOT)
    timeline = demo_timeline()
    record = Record()
    link = sim_link("so101").with_name(f"na_demo_{ROBOT}_{os.getpid()}")
    world = World(timeline, link, record)
    stack_cmd = [sys.executable, "-m", "na_bringup.runner", "so101", "--port", str(link)]
    if args.model:
        stack_cmd += ["--model", args.model]
    stack = subprocess.Popen(stack_cmd)
    rclpy.init()
    node = _monitor_node(world, record, list(robot.joint_names))
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"[demo] simulated SO-101 on {world.device} (link {link}); stack: {' '.join(stack_cmd[1:])}", flush=True)
    scenario_start_wall = None
    last: dict = {}
    deadline = time.monotonic() + 90.0           # start-up (discovery, model load) + the 20 s scenario
    next_tick = time.monotonic() + 1.0
    try:
        while not stop.is_set() and time.monotonic() < deadline and stack.poll() is None:
            executor.spin_once(timeout_sec=0.02)
            if world.t0 is not None and scenario_start_wall is None:
                scenario_start_wall = time.time()
            if time.monotonic() >= next_tick:
                next_tick += 1.0
                print(status_line(record, world, last), flush=True)
            t = world.scenario_time()
            if t is not None and t >= timeline.duration:
                break
    finally:
        if stack.poll() is None:
            stack.send_signal(signal.SIGINT)
            try:
                stack.wait(20)
            except subprocess.TimeoutExpired:
                stack.kill()
                stack.wait()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
        world.close()

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(record, scenario_start_wall)
    summary["diagnostics_last"] = record.diagnostics
    summary["scenario"] = {"payload_kg": PAYLOAD_KG, "push_n": PUSH_N.tolist(), "duration_s": timeline.duration,
                           "completed": world.t0 is not None and (world.scenario_time() or 0) >= timeline.duration}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if summary.get("estimates", 0):
        plot(record, out / "force.png", scenario_start_wall)
    lines = ["# make demo summary (computed from this run)", ""]
    lines += [f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in summary.items()
              if k not in ("diagnostics_last",)]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[2:]))
    if not summary.get("estimates"):
        print("[demo] no force estimates were received: see the stack's log above", flush=True)
        return 1
    print(f"[demo] plot: {(out / 'force.png').resolve()}\n[demo] summary: {(out / 'summary.json').resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
