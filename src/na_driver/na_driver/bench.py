"""na-driver-bench: achieved driver rate and CPU per cycle for SO-101 and OMX against the na_sim emulators.

Each cycle is what driver_node does: one sync read of the telemetry block + decode, one sync write of
goals. The emulated bus runs in a separate process (as real servos are not in the driver's process)
with wire timing at the given baud rate (each byte takes 10 bits/baud), so the rate includes the bus
time a real adapter would take. CPU per cycle is this process's CPU time. The bus-physics ceiling is
the wire time of one cycle's bytes at that baud rate.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from na_description.robot_table import load_robot
from na_driver.bus import ServoBus, make_bus

CASES = (("so101", 1_000_000), ("omx", 1_000_000), ("omx", 4_000_000))


def cycle_bytes(bus: ServoBus, with_write: bool = True) -> int:
    """Bytes on the wire per cycle: sync read request + one status packet per servo (+ goal sync write)."""
    n, block = len(bus.ids), bus.block_length
    goal = bus.robot.bus.register("goal_position").size
    if bus.robot.bus.family == "dynamixel":
        read = 14 + n + n * (11 + block)
        write = 14 + n * (1 + goal)
    else:
        read = 8 + n + n * (6 + block)
        write = 8 + n * (1 + goal)
    return read + write if with_write else read


def serve(robot_name: str, baud: int, link: str) -> None:
    """Child process: an emulated bus (StaticBackend) with wire timing, until stdin closes."""
    from na_sim.bus import StaticBackend, make_emulator

    robot = load_robot(robot_name)
    with make_emulator(robot, StaticBackend(robot.n_joints), link=link, wire_baud=baud):
        print("ready", flush=True)
        sys.stdin.read()


def bench(robot_name: str, baud: int, cycles: int, tqdm_disable: bool = False) -> dict:
    from tqdm import tqdm

    robot = load_robot(robot_name)
    with tempfile.TemporaryDirectory() as tmp:
        link = str(Path(tmp) / "ttyBENCH")
        child = subprocess.Popen([sys.executable, "-m", "na_driver.bench", "--serve", robot_name, str(baud), link],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("the emulated bus did not start")
            if baud != robot.bus.baudrate:          # servos power up at the table's rate: switch them first
                setup = make_bus(robot, link)
                setup.connect()
                setup.set_servo_baudrate(baud)
                setup.close()
            bus = make_bus(robot, link, baudrate=baud)
            bus.connect()
            goals = np.zeros(robot.n_joints)
            for _ in range(20):                                   # warm-up
                bus.read()
                bus.write_goals(goals)
            cpu = np.empty(cycles)
            wall0 = time.perf_counter()
            for i in tqdm(range(cycles), desc=f"{robot_name} @ {baud / 1e6:g} Mbps", leave=False,
                          disable=tqdm_disable):
                c0 = time.process_time()
                bus.read()
                bus.write_goals(goals)
                cpu[i] = time.process_time() - c0
            wall = time.perf_counter() - wall0
            failed = bus.stats.reads_failed
            bus.close()
        finally:
            child.stdin.close()
            child.wait(timeout=10)
    return {"robot": robot_name, "baud": baud, "cycles": cycles, "rate_hz": cycles / wall,
            "ceiling_hz": baud / (10.0 * cycle_bytes(bus)),
            "read_ceiling_hz": baud / (10.0 * cycle_bytes(bus, with_write=False)),
            "cpu_ms_mean": 1e3 * cpu.mean(), "cpu_ms_p95": 1e3 * np.percentile(cpu, 95), "failed": failed}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(argv[1], int(argv[2]), argv[3])
        return
    parser = argparse.ArgumentParser(prog="na-driver-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000, help="measured cycles per case")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load}; emulated bus in a separate process")
    print(f"{'robot':6} {'bus':>8} {'achieved':>10} {'ceiling':>9} {'read-only':>10} {'CPU/cycle':>10} "
          f"{'CPU p95':>8} {'failed':>6}")
    for robot_name, baud in CASES:
        r = bench(robot_name, baud, args.cycles, args.no_progress)
        print(f"{r['robot']:6} {r['baud'] / 1e6:6g}M {r['rate_hz']:8.0f}Hz {r['ceiling_hz']:7.0f}Hz "
              f"{r['read_ceiling_hz']:8.0f}Hz {r['cpu_ms_mean']:8.3f}ms {r['cpu_ms_p95']:6.3f}ms {r['failed']:6d}")
    print("ceiling = wire time of read + goal write; read-only = the sync read alone (architecture.md's figure)")
    print("goals: SO-101 >= 200 Hz, OMX (4 Mbps) >= 400 Hz, CPU < 0.3 ms per cycle")


if __name__ == "__main__":
    main()
