"""Realism against real data: replay the leader commands of real NAD files through the simulated arm
(SO-101: same payload, attached while the file labels force_z) and measure how far the simulated
telemetry is from the recording; fit a few actuator parameters to close the gap (done for the SO-101).

    python -m na_sim.realism --nad ../shared/nad --out realism/            # measure only
    python -m na_sim.realism --nad ../shared/nad --out realism/ --fit      # fit, then measure before/after

Writes ``realism.json`` (per-file and mean MAE per joint) and ``realism.png`` (one file's traces).
The fitted values belong in the robot table's ``sim_actuator`` section (printed as YAML).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from na_description.robot_table import load_robot
from na_inference.nad import Trajectory, find_trajectories, load_trajectory
from na_sim.actuator import ServoParams
from na_sim.arm import GRAVITY, SimulatedArm

# What the fit may change (names of ServoParams fields), with bounds; log-space search.
FIT_PARAMETERS: dict[str, tuple[float, float]] = {
    "motor_resistance": (2.0, 12.0),
    "efficiency_backward": (0.3, 0.99),
    "coulomb_friction": (0.005, 0.3),
    "viscous_friction": (0.005, 0.5),
    "duty_per_count_s_d": (1e-8, 2e-5),
}
LOAD_SCALE = 0.02     # duty error that weighs as much as one degree of position error in the fit


@dataclass
class Replay:
    robot: str
    path: Path
    time: np.ndarray
    recorded_position: np.ndarray   # [T, J] rad
    simulated_position: np.ndarray  # [T, J] rad (telemetry of the sim, at the recorded timestamps)
    recorded_load: np.ndarray       # [T, J] duty
    simulated_load: np.ndarray      # [T, J] duty
    recorded_current: np.ndarray    # [T, J] A
    simulated_current: np.ndarray   # [T, J] A
    recorded_voltage: np.ndarray    # [T, J] V
    simulated_voltage: np.ndarray   # [T, J] V

    def position_mae_deg(self) -> np.ndarray:
        return np.degrees(np.abs(self.simulated_position[1:] - self.recorded_position[1:]).mean(axis=0))

    def load_mae(self) -> np.ndarray:
        return np.abs(self.simulated_load[1:] - self.recorded_load[1:]).mean(axis=0)

    def current_mae(self) -> np.ndarray:
        return np.abs(self.simulated_current[1:] - self.recorded_current[1:]).mean(axis=0)

    def voltage_mae(self) -> np.ndarray:
        return np.abs(self.simulated_voltage[1:] - self.recorded_voltage[1:]).mean(axis=0)


def replay(traj: Trajectory, params: ServoParams | None = None, seed: int = 0,
           max_frames: int | None = None) -> Replay:
    """Drive the sim with the file's goal_position at its timestamps; in payload tasks the payload is
    attached while force_z is labelled."""
    robot = load_robot(traj.robot)
    q = traj.quantities
    frames = len(traj) if max_frames is None else min(len(traj), max_frames)
    arm = SimulatedArm(robot, seed=seed, params=params, initial_position=q["position"][0])
    arm.bank.winding_temp[:] = q["temperature"][0]
    arm.bank.case_temp[:] = q["temperature"][0]
    # A payload task labels force_z = -m g while the payload is held; other files (OMX F/T pushes)
    # carry measured forces in the sensor frame, which are not replayed.
    weight = -traj.force[:, 2] if traj.payload_kg is not None else np.full(len(traj), np.nan)
    sim_pos = np.zeros((frames, robot.n_joints))
    sim_load = np.zeros((frames, robot.n_joints))
    sim_current = np.zeros((frames, robot.n_joints))
    sim_voltage = np.zeros((frames, robot.n_joints))

    def record(row: int) -> None:
        states = arm.servo_states()
        sim_pos[row] = [s.position for s in states]
        sim_load[row] = [s.load for s in states]
        sim_current[row] = [s.current for s in states]
        sim_voltage[row] = [s.voltage for s in states]

    record(0)
    t0 = traj.time[0]
    for k in range(frames - 1):
        mass = weight[k] / GRAVITY if np.isfinite(weight[k]) else 0.0
        if mass != arm.payload_mass:
            arm.set_payload(max(0.0, mass))
        arm.set_goal_vector(q["goal_position"][k])
        target = traj.time[k + 1] - t0
        steps = max(1, round((target - arm.time) / arm.timestep))
        arm.step(steps)
        record(k + 1)
    return Replay(traj.robot, traj.path or Path("?"), traj.time[:frames], q["position"][:frames], sim_pos,
                  q["load"][:frames], sim_load, q["current"][:frames], sim_current, q["voltage"][:frames],
                  sim_voltage)


def arm_joints(robot: str) -> list[int]:
    """Joints compared: all but the gripper (the real gripper squeezes an object the sim lacks)."""
    table = load_robot(robot)
    return [j for j, name in enumerate(table.joint_names) if name != table.gripper_joint]


def summarize(replays: list[Replay], robot: str = "so101") -> dict:
    names = load_robot(robot).joint_names
    per_file = []
    for r in replays:
        per_file.append({"file": str(r.path), "frames": len(r.time),
                         "position_mae_deg": dict(zip(names, np.round(r.position_mae_deg(), 3).tolist())),
                         "load_mae_duty": dict(zip(names, np.round(r.load_mae(), 4).tolist())),
                         "current_mae_a": dict(zip(names, np.round(r.current_mae(), 4).tolist())),
                         "voltage_mae_v": dict(zip(names, np.round(r.voltage_mae(), 3).tolist()))})
    pos = np.mean([r.position_mae_deg() for r in replays], axis=0)
    load = np.mean([r.load_mae() for r in replays], axis=0)
    current = np.mean([r.current_mae() for r in replays], axis=0)
    voltage = np.mean([r.voltage_mae() for r in replays], axis=0)
    joints = arm_joints(robot)
    return {"files": len(replays),
            "position_mae_deg": dict(zip(names, np.round(pos, 3).tolist())),
            "load_mae_duty": dict(zip(names, np.round(load, 4).tolist())),
            "arm_position_mae_deg": round(float(pos[joints].mean()), 3),
            "arm_load_mae_duty": round(float(load[joints].mean()), 4),
            "current_mae_a": dict(zip(names, np.round(current, 4).tolist())),
            "voltage_mae_v": dict(zip(names, np.round(voltage, 3).tolist())),
            "per_file": per_file}


def fit(trajectories: list[Trajectory], base: ServoParams, max_frames: int, max_evaluations: int = 40,
        progress: bool = True) -> tuple[ServoParams, dict]:
    """Least squares (scipy) over FIT_PARAMETERS on the given trajectories' first ``max_frames``."""
    from scipy.optimize import least_squares
    from tqdm import tqdm

    names = list(FIT_PARAMETERS)
    lower = np.log([FIT_PARAMETERS[n][0] for n in names])
    upper = np.log([FIT_PARAMETERS[n][1] for n in names])
    start = np.clip(np.log([float(np.mean(getattr(base, n))) for n in names]), lower + 1e-6, upper - 1e-6)
    joints = arm_joints(trajectories[0].robot)
    bar = tqdm(total=max_evaluations, desc="fit", unit="eval", disable=not progress)
    history: list[float] = []
    best: dict = {"cost": math.inf, "x": start}

    def residuals(x: np.ndarray) -> np.ndarray:
        if len(history) >= max_evaluations:
            raise _BudgetSpentError
        params = base.with_values(**dict(zip(names, np.exp(x).tolist())))
        out = []
        for traj in trajectories:
            r = replay(traj, params, max_frames=max_frames)
            out.append(np.degrees(r.simulated_position[1:, joints] - r.recorded_position[1:, joints]).ravel())
            out.append(((r.simulated_load[1:, joints] - r.recorded_load[1:, joints]) / LOAD_SCALE).ravel())
        res = np.concatenate(out)
        history.append(float(np.mean(res**2)))
        if history[-1] < best["cost"]:
            best.update(cost=history[-1], x=np.array(x))
        bar.update(1)
        bar.set_postfix(cost=f"{history[-1]:.3f}", best=f"{best['cost']:.3f}")
        return res

    # Quantised encoders make the cost piecewise flat: finite differences need large steps. Every
    # evaluation counts against the budget (scipy's max_nfev leaves out the Jacobian's), and the
    # best point seen wins.
    with contextlib.suppress(_BudgetSpentError):
        least_squares(residuals, start, bounds=(lower, upper), diff_step=0.08)
    bar.close()
    fitted = dict(zip(names, np.exp(best["x"]).tolist()))
    return base.with_values(**fitted), {"fitted": fitted, "evaluations": len(history),
                                        "cost_start": history[0], "cost_end": best["cost"]}


class _BudgetSpentError(Exception):
    """The fit used its evaluation budget."""


def plot(replay_: Replay, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = load_robot(replay_.robot).joint_names
    fig, axes = plt.subplots(2, 5, figsize=(18, 6), sharex=True)
    t = replay_.time - replay_.time[0]
    for j in range(5):
        axes[0, j].plot(t, np.degrees(replay_.recorded_position[:, j]), label="recorded")
        axes[0, j].plot(t, np.degrees(replay_.simulated_position[:, j]), label="simulated")
        axes[0, j].set_title(f"{names[j]} position (deg)")
        axes[1, j].plot(t, replay_.recorded_load[:, j], label="recorded")
        axes[1, j].plot(t, replay_.simulated_load[:, j], label="simulated")
        axes[1, j].set_title(f"{names[j]} load (duty)")
        axes[1, j].set_xlabel("s")
    axes[0, 0].legend()
    fig.suptitle(f"{replay_.robot} replay: {replay_.path}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m na_sim.realism", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nad", type=Path, required=True, help="NAD root (so101/, force_sensor/, ... folders)")
    parser.add_argument("--robot", default="so101", choices=("so101", "omx"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fit", action="store_true", help="fit FIT_PARAMETERS first, then compare before/after")
    parser.add_argument("--fit-files", type=int, default=4, help="files used by the fit (spread over tasks)")
    parser.add_argument("--fit-frames", type=int, default=300, help="frames per file used by the fit")
    parser.add_argument("--fit-evaluations", type=int, default=40)
    parser.add_argument("--untuned", action="store_true",
                        help="start from the untuned defaults of the fitted parameters (ignore the table's fit)")
    args = parser.parse_args(argv)
    paths = find_trajectories(args.nad, args.robot, split=None)
    trajectories = [load_trajectory(p, args.robot) for p in paths]
    args.out.mkdir(parents=True, exist_ok=True)
    base = ServoParams.from_robot(load_robot(args.robot))
    if args.untuned:
        defaults = ServoParams()
        base = base.with_values(**{name: getattr(defaults, name) for name in FIT_PARAMETERS})
    report: dict = {"nad": str(args.nad), "robot": args.robot, "untuned": args.untuned}
    started = time.perf_counter()
    report["before"] = summarize([replay(t, base) for t in trajectories], args.robot)
    if args.fit:
        step = max(1, len(trajectories) // args.fit_files)
        subset = trajectories[::step][: args.fit_files]
        tuned, info = fit(subset, base, args.fit_frames, args.fit_evaluations)
        info["files"] = [str(t.path) for t in subset]
        info["frames_per_file"] = args.fit_frames
        report["fit"] = info
        after = [replay(t, tuned) for t in trajectories]
        report["after"] = summarize(after, args.robot)
        plot(after[0], args.out / "realism.png")
        print("sim_actuator values to put in so101.yaml:")
        for name, value in info["fitted"].items():
            print(f"  {name}: {value:.4g}")
    else:
        plot(replay(trajectories[0], base), args.out / "realism.png")
    report["seconds"] = round(time.perf_counter() - started, 1)
    (args.out / "realism.json").write_text(json.dumps(report, indent=2))
    for key in ("before", "after"):
        if key in report:
            r = report[key]
            print(f"{key}: arm position MAE {r['arm_position_mae_deg']:.3f} deg, arm load MAE "
                  f"{r['arm_load_mae_duty']:.4f} duty; per joint deg {r['position_mae_deg']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

