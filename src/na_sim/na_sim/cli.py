"""Console commands: ``na-sim-bus`` (a real-time simulated arm behind an emulated servo bus) and
``na-sim-dataset`` (synthetic NAD episodes with ground truth)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

from na_description.robot_table import RobotTableError, load_robot, robot_names
from na_sim.scenarios import SCENARIOS


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def bus_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="na-sim-bus",
        description="Run a simulated arm (MuJoCo + servo physics) in real time behind a protocol-accurate "
                    "emulated servo bus on a pseudo-terminal; prints the device path, runs until SIGINT/SIGTERM. "
                    "The Panda has no servo bus: it streams joint states and torques as JSON lines instead.")
    parser.add_argument("--robot", required=True, choices=robot_names())
    parser.add_argument("--link", help="also expose the bus at this path (a symlink to the pty), e.g. /tmp/ttySO101")
    parser.add_argument("--scenario", choices=SCENARIOS,
                        help="scenario events to play (payload, pushes, surface, restricted joint), repeated")
    parser.add_argument("--faults", help='bus fault injection, e.g. "drop=0.05,corrupt=0.02,late=0.01,echo=1"')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=1.0, help="simulated seconds per wall second (default 1)")
    args = parser.parse_args(argv)
    if not 0.01 <= args.rate <= 100:
        parser.error("--rate must be within 0.01..100")

    from na_sim.arm import SimulatedArm
    from na_sim.scenarios import make_scenario

    robot = load_robot(args.robot)
    scenario = make_scenario(args.scenario, robot, args.seed) if args.scenario else None
    start_pose = scenario.initial_position if scenario is not None else None
    arm = SimulatedArm(robot, seed=args.seed, initial_position=start_pose)
    stop = _stop_on_signals()
    emulator = None
    if robot.bus.family in ("feetech_sts", "dynamixel"):
        from na_sim.bus.emulator import FaultSpec, make_emulator

        try:
            faults = FaultSpec.parse(args.faults) if args.faults else None
        except ValueError as exc:
            parser.error(f"--faults: {exc}")
        emulator = make_emulator(robot, arm, faults=faults, link=args.link)
        path = emulator.start()
        print(path, flush=True)
    else:
        if args.link or args.faults:
            parser.error(f"{robot.name} has no servo bus ({robot.bus.family}): --link/--faults do not apply")
        print(f"{robot.name}: no servo bus ({robot.bus.family}); streaming JSON lines every "
              f"{robot.data_dt} s", flush=True)
    arm.start(rate=args.rate)
    try:
        _play(arm, scenario, stop, stream=emulator is None, period=robot.data_dt)
    finally:
        arm.stop()
        if emulator is not None:
            emulator.stop()
    return 0


def _play(arm, scenario, stop: threading.Event, stream: bool, period: float) -> None:
    """Fire scenario events as simulated time passes (looping the scenario); stream if asked."""
    last = -1.0
    while not stop.wait(period if stream else 0.01):
        now = arm.time
        if scenario is not None:
            cycle = now % scenario.duration
            if cycle < last:
                last = -1.0
            with arm.lock:
                scenario.apply(arm, last, cycle)
                if stream:   # no bus host: the scenario's leader trajectory drives the arm
                    arm.set_goal_vector(scenario.goal(cycle))
            last = cycle
        if stream:
            states = arm.servo_states()
            truth = arm.truth()
            line = {"t": round(now, 4), "name": list(arm.robot.joint_names),
                    "position": [s.position for s in states], "velocity": [s.velocity for s in states],
                    "effort": [round(float(v), 5) for v in truth.joint_torque],
                    "external_force": [round(float(v), 5) for v in truth.external_force]}
            try:
                print(json.dumps(line), flush=True)
            except BrokenPipeError:
                return


def dataset_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="na-sim-dataset",
        description="Write synthetic episodes in the exact NAD CSV schema plus ground-truth columns "
                    "(true_torque*, true_force_*, true_contact, true_condition*); deterministic per seed.")
    parser.add_argument("--robot", default="so101", choices=("so101", "omx"))
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output folder (NAD-release-like tree)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, cycled over episodes (default: all: {','.join(SCENARIOS)})")
    parser.add_argument("--duration", type=float, help="minimum episode length in s (default per scenario)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    names = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown or not names:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    if args.duration is not None and not 1.0 <= args.duration <= 3600:
        parser.error("--duration must be within 1..3600 s")

    from na_sim.dataset import generate

    start = time.perf_counter()
    try:
        paths = generate(args.robot, args.episodes, args.seed, args.out, names, args.duration,
                         progress=not args.no_progress)
    except (RobotTableError, ValueError, OSError) as exc:
        print(f"na-sim-dataset: {exc}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - start
    frames = 0
    for path in paths:
        with path.open() as handle:
            frames += sum(1 for _ in handle) - 1
    simulated = frames * load_robot(args.robot).data_dt
    print(f"wrote {len(paths)} episodes, {frames} frames ({simulated:.1f} s simulated) to {args.out} "
          f"in {wall:.1f} s ({simulated / wall:.1f}x real time)")
    return 0
