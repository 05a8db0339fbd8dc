"""``na-sim-bench``: how fast the real servo SDKs can poll the emulated buses, and how fast the
simulated arms run.

For each robot the emulator runs in a child process (as ``na-sim-bus`` does; no GIL shared with the
SDK) and the SDK in this process sync-reads the whole telemetry block of every servo as fast as it
can. A pty has no baud rate, so the report also gives the bytes one cycle puts on the wire and the
cycle rate a real bus at the robot table's baud rate allows; ``--wire-baud`` makes the emulator hold
each reply for its wire time to show the SDK at that rate. With ``--sim`` the backend is the MuJoCo
arm running in real time (physics, servo model and bus share the child's CPU) instead of a static
one; the simulation's real-time factor is measured separately with the physics at full speed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection

from na_description.robot_table import load_robot

BUS_ROBOTS = ("so101", "omx")


@dataclass
class BusResult:
    robot: str
    mode: str  # sync_read / fast_sync_read
    backend: str  # static / sim
    wire_baud: int | None
    cycles: int
    failures: int
    seconds: float
    p50_ms: float
    p99_ms: float
    bytes_per_cycle: float
    table_baud: int
    sim_rtf: float | None = None  # simulated s per wall s of the arm behind the bus, when --sim
    #: failed cycles by the SDK's own text for the result code (a timeout is the host's scheduling,
    #: anything else is a protocol fault)
    failure_codes: dict[str, int] = field(default_factory=dict)
    malformed: int = 0  # bytes or packets the emulator had to skip: must stay 0 with a healthy SDK

    @property
    def rate_hz(self) -> float:
        return self.cycles / self.seconds

    @property
    def baud(self) -> int:
        """The emulated wire's baud rate, else the robot table's."""
        return self.wire_baud or self.table_baud

    @property
    def wire_ms(self) -> float:
        """Time one cycle's bytes take on a real bus at ``baud`` (10 bits a byte, return delay 0)."""
        return self.bytes_per_cycle * 10.0 / self.baud * 1000.0

    def row(self) -> str:
        link = "wire" if self.wire_baud else "pty"
        rtf = f"{self.sim_rtf:5.2f}" if self.sim_rtf is not None else "    -"
        return (f"{self.robot:6s} {self.mode:15s} {self.backend:7s} {link:4s} {self.baud:8d} {self.rate_hz:9.0f} "
                f"{self.p50_ms:7.3f} {self.p99_ms:7.3f} {self.failures:5d} {self.bytes_per_cycle:6.0f} "
                f"{self.wire_ms:8.3f} {1000.0 / self.wire_ms:9.0f} {rtf}")


HEADER = ("robot  mode            backend link     baud  cycles/s  p50 ms  p99 ms  fail  bytes  wire ms  "
          "wire Hz   rtf")


def _serve(robot: str, wire_baud: int | None, use_sim: bool, conn: Connection) -> None:
    """Child process: an emulator (static or simulated arm) until the parent says stop."""
    from na_sim.bus import StaticBackend, make_emulator

    table = load_robot(robot)
    arm = None
    if use_sim:
        from na_sim.arm import SimulatedArm

        arm = SimulatedArm(table)
        backend = arm
    else:
        backend = StaticBackend(table.n_joints)
    emulator = make_emulator(table, backend, wire_baud=wire_baud, initial_torque=True)
    conn.send(emulator.start())
    wall0 = time.monotonic()
    if arm is not None:
        arm.start()
    conn.recv()
    sim_rtf = None
    if arm is not None:
        arm.stop()
        sim_rtf = arm.time / (time.monotonic() - wall0)
    emulator.stop()
    conn.send({"stats": asdict(emulator.stats), "sim_rtf": sim_rtf})
    conn.close()


def bench_bus(robot: str, seconds: float, wire_baud: int | None = None, fast: bool = False,
              use_sim: bool = False) -> BusResult:
    """Sync-read the telemetry block of every servo of ``robot`` for ``seconds`` with the real SDK."""
    table = load_robot(robot)
    parent, child = mp.Pipe()
    proc = mp.get_context("fork").Process(target=_serve, args=(robot, wire_baud, use_sim, child), daemon=True)
    proc.start()
    try:
        path = parent.recv()
        port, read, describe = _sdk_sync_read(table, path, fast)
        for _ in range(20):  # warm up (first packets, page faults)
            read()
        times: list[float] = []
        failure_codes: dict[str, int] = {}
        start = time.perf_counter()
        deadline = start + seconds
        now = start
        while now < deadline:
            result = read()
            after = time.perf_counter()
            if result == 0:
                times.append(after - now)
            else:
                text = describe(result)
                failure_codes[text] = failure_codes.get(text, 0) + 1
                port.ser.reset_input_buffer()
            now = after
        elapsed = now - start
        port.closePort()
        parent.send("stop")
        report = parent.recv()
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    stats = report["stats"]
    failures = sum(failure_codes.values())
    total_cycles = len(times) + failures + 20
    quantiles = statistics.quantiles(times, n=100) if len(times) >= 2 else [float("nan")] * 99
    return BusResult(
        robot=robot, mode="fast_sync_read" if fast else "sync_read", backend="sim" if use_sim else "static",
        wire_baud=wire_baud, cycles=len(times), failures=failures, seconds=elapsed,
        p50_ms=statistics.median(times) * 1000 if times else float("nan"), p99_ms=quantiles[98] * 1000,
        bytes_per_cycle=(stats["bytes_in"] + stats["bytes_out"]) / total_cycles,
        table_baud=table.bus.baudrate, sim_rtf=report["sim_rtf"], failure_codes=failure_codes,
        malformed=stats["malformed"],
    )


def _sdk_sync_read(table, path: str, fast: bool):
    """Open the real SDK on ``path``; returns (port, one-cycle function -> SDK result code, the SDK's
    text for a result code)."""
    start, length = table.bus.telemetry_start, table.bus.telemetry_length
    if table.bus.family == "dynamixel":
        import dynamixel_sdk as sdk

        port, ph = sdk.PortHandler(path), sdk.PacketHandler(2.0)
    else:
        import scservo_sdk as sdk

        port, ph = sdk.PortHandler(path), sdk.PacketHandler(table.bus.extra.get("protocol_end", 0))
    if not port.openPort():
        raise RuntimeError(f"cannot open {path}")
    group = sdk.GroupSyncRead(port, ph, start, length)
    for servo_id in table.bus.ids:
        group.addParam(servo_id)
    return port, group.fastSyncRead if fast else group.txRxPacket, ph.getTxRxResult


def bench_physics(robot: str, seconds: float) -> float | None:
    """Real-time factor of the simulated arm at full speed (None when the physics is unavailable)."""
    try:
        from na_sim.arm import measure_real_time_factor
    except ImportError:
        return None
    return measure_real_time_factor(robot, seconds=seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="na-sim-bench",
        description="SDK sync-read cycles per second against the emulated Feetech (SO-101) and Dynamixel "
                    "(OpenManipulator-X) buses, the wire time the same bytes need on a real bus, and the "
                    "simulated arms' real-time factor.")
    parser.add_argument("--robots", default=",".join(BUS_ROBOTS), help="comma-separated (default so101,omx)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    parser.add_argument("--wire-baud", type=int, default=0,
                        help="also measure with each reply held for its wire time at this baud rate "
                             "(0 = off; try 1000000 or 4000000)")
    parser.add_argument("--sim", action="store_true",
                        help="also measure with the MuJoCo arm running in real time behind the bus")
    parser.add_argument("--no-physics", action="store_true", help="skip the real-time-factor measurement")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    robots = [r.strip() for r in args.robots.split(",") if r.strip()]
    for robot in robots:
        if robot not in BUS_ROBOTS:
            parser.error(f"{robot!r} has no emulated servo bus; choose from {', '.join(BUS_ROBOTS)}")
    if not 0.2 <= args.seconds <= 600:
        parser.error("--seconds must be within 0.2..600")
    if args.wire_baud < 0:
        parser.error("--wire-baud must be >= 0")

    plan = []
    for robot in robots:
        modes = [False, True] if load_robot(robot).bus.family == "dynamixel" else [False]
        plan += [(robot, None, fast, False) for fast in modes]
        if args.wire_baud:
            plan += [(robot, args.wire_baud, fast, False) for fast in modes]
        if args.sim:
            plan.append((robot, None, False, True))
    load = os.getloadavg()
    print(f"na-sim-bench: {len(plan)} bus measurements x {args.seconds:g} s, telemetry block of every servo "
          f"per cycle; {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("link pty = as fast as the pty goes; wire = each reply held for its wire time at 'baud'. "
          "'wire ms/Hz' = what the same bytes allow on a real bus at 'baud'.")
    print(HEADER)
    results = []
    for robot, baud, fast, use_sim in plan:
        result = bench_bus(robot, args.seconds, wire_baud=baud, fast=fast, use_sim=use_sim)
        results.append(result)
        print(result.row(), flush=True)
        if result.failure_codes or result.malformed:
            print(f"       failed cycles: {result.failure_codes}; bytes/packets the emulator skipped: "
                  f"{result.malformed}", flush=True)
    physics = {}
    if not args.no_physics:
        for robot in robots:
            rtf = bench_physics(robot, seconds=min(args.seconds, 5.0))
            physics[robot] = rtf
            text = f"{rtf:.2f}x real time" if rtf is not None else "unavailable (na_sim.arm missing)"
            print(f"simulation {robot}: {text} (SimulatedArm.advance, full servo physics)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"load_average": load, "cpus": os.cpu_count(),
                       "bus": [{**asdict(r), "rate_hz": r.rate_hz, "wire_ms": r.wire_ms} for r in results],
                       "real_time_factor": physics}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
