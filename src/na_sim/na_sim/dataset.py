"""Synthetic NAD episodes: a scenario driven through the simulated arm, sampled at the robot's data
period, written in the exact NAD CSV schema (na_inference.nad) plus ground-truth columns.

Ground-truth columns, appended after the NAD columns (NAD readers ignore them):
``true_torque<i>`` (N.m delivered to joint i), ``true_force_x/y/z`` (N, world frame, on the end
effector), ``true_contact`` (0/1, |force| > 0.01 N), ``true_condition<i>`` (1 normal, 0 restricted).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from na_description.robot_table import RobotTable, load_robot
from na_inference.nad import Trajectory, add_gripper_aperture, format_trajectory
from na_sim.arm import SimulatedArm
from na_sim.scenarios import SCENARIOS, Scenario, make_scenario

DATASET_ROBOTS = ("so101", "omx")
# Where each kind of episode sits in a NAD-release-like tree (so na_inference.nad finds it).
OMX_FOLDERS = {"push": "force_sensor", "contact": "force_sensor", "pick_and_place": "weight",
               "go_up_and_stay": "weight", "restricted": "motor_condition"}


@dataclass
class Episode:
    trajectory: Trajectory
    truth_torque: np.ndarray      # [T, J]
    truth_force: np.ndarray       # [T, 3]
    truth_contact: np.ndarray     # [T]
    truth_condition: np.ndarray   # [T, J]
    scenario: Scenario


def simulate_episode(robot: str | RobotTable, scenario: Scenario, seed: int = 0) -> Episode:
    """Run ``scenario`` on a fresh arm and sample it every ``data_dt`` like the NAD recorder."""
    table = load_robot(robot) if isinstance(robot, str) else robot
    arm = SimulatedArm(table, seed=seed, initial_position=scenario.initial_position)
    n_frames = int(scenario.duration / table.data_dt)
    J = table.n_joints
    keys = ("position", "goal_position", "velocity", "load", "current", "voltage", "temperature")
    out = {k: np.zeros((n_frames, J)) for k in keys}
    times = np.zeros(n_frames)
    torque, force = np.zeros((n_frames, J)), np.zeros((n_frames, 3))
    contact, condition = np.zeros(n_frames), np.ones((n_frames, J))
    scenario.apply(arm, -1.0, 0.0)
    for k in range(n_frames):
        arm.set_goal_vector(scenario.goal(arm.time))    # the leader command, sampled like the recorder
        frame_time = (k + 1) * table.data_dt
        while arm.time < frame_time - 1e-9:
            # Step to the next event (or the frame), so events act at their time, not the frame's.
            upcoming = [e.time for e in scenario.events if arm.time < e.time <= frame_time]
            until = min(upcoming) if upcoming else frame_time
            before = arm.time
            arm.step(max(1, int(np.ceil((until - arm.time) / arm.timestep - 1e-9))))
            scenario.apply(arm, before, arm.time)
        states = arm.servo_states()
        times[k] = arm.time
        out["goal_position"][k] = arm.bank.goal
        for name in ("position", "velocity", "load", "current", "voltage", "temperature"):
            out[name][k] = [getattr(s, name) for s in states]
        truth = arm.truth()
        torque[k], force[k], contact[k], condition[k] = (truth.joint_torque, truth.external_force,
                                                         float(truth.contact), truth.condition)
    quantities = {k: v + 0.0 for k, v in out.items()}   # + 0.0 turns -0.0 into 0.0 for the CSV
    add_gripper_aperture(table.name, quantities)   # the OMX's NAD gripper opening (mm)
    traj = Trajectory(robot=table.name, path=None, task=scenario.name, payload_kg=scenario.payload_kg,
                      time=times, quantities=quantities, force=nad_force_labels(force, arm.robot, scenario),
                      condition=condition[0] if scenario.restricted_joint is not None else None)
    return Episode(traj, torque, force, contact, condition, scenario)


def nad_force_labels(force: np.ndarray, robot: RobotTable, scenario: Scenario) -> np.ndarray:
    """NAD-style force columns: NaN (-999) where no force acts; a payload alone labels z only (as NAD
    does: -m g); pushes and contacts label all three axes with the true world-frame force."""
    labels = np.full_like(force, np.nan)
    acting = np.linalg.norm(force, axis=1) > 0.01
    horizontal = np.linalg.norm(force[:, :2], axis=1) > 1e-9
    labels[acting & horizontal] = force[acting & horizontal]
    weight_only = acting & ~horizontal
    labels[weight_only, 2] = force[weight_only, 2]
    return labels


def episode_text(episode: Episode) -> str:
    """The NAD CSV text with the ground-truth columns appended to every row."""
    nad_lines = format_trajectory(episode.trajectory).split("\r\n")
    J = episode.truth_torque.shape[1]
    header = ([f"true_torque{j + 1}" for j in range(J)] + ["true_force_x", "true_force_y", "true_force_z",
              "true_contact"] + [f"true_condition{j + 1}" for j in range(J)])
    lines = [nad_lines[0] + "," + ",".join(header)]
    for k in range(len(episode.truth_contact)):
        extra = ([f"{v:.5f}" for v in episode.truth_torque[k]] + [f"{v:.5f}" for v in episode.truth_force[k]]
                 + [str(int(episode.truth_contact[k]))] + [str(int(v)) for v in episode.truth_condition[k]])
        lines.append(nad_lines[k + 1] + "," + ",".join(extra))
    return "\r\n".join(lines) + "\r\n"


def episode_path(out: Path, robot: RobotTable, scenario: Scenario, index: int) -> Path:
    """A NAD-release-like location: <out>/<folder>/<task>[/<payload>g]/train/<index>.csv."""
    folder = "so101" if robot.name == "so101" else OMX_FOLDERS.get(scenario.name, "force_unlabeled")
    parts = [folder, scenario.name]
    if scenario.payload_kg is not None:
        parts.append(f"{round(scenario.payload_kg * 1000)}g")
    return out.joinpath(*parts, "train", f"{index:03d}.csv")


def write_episode(path: Path, episode: Episode) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("w", newline="") as handle:
        handle.write(episode_text(episode))
    os.replace(tmp, path)


def generate(robot: str, episodes: int, seed: int, out: Path, scenarios: tuple[str, ...] = SCENARIOS,
             duration: float | None = None, progress: bool = True) -> list[Path]:
    """Write ``episodes`` episodes; episode i uses scenario scenarios[i % len] and seed (seed, i)."""
    if robot not in DATASET_ROBOTS:
        raise ValueError(f"na-sim-dataset supports {', '.join(DATASET_ROBOTS)}, not {robot!r}")
    from tqdm import tqdm

    table = load_robot(robot)
    paths = []
    for i in tqdm(range(episodes), desc=f"{robot} episodes", unit="ep", disable=not progress):
        rng = np.random.default_rng([seed, i])
        name = scenarios[i % len(scenarios)]
        scenario = make_scenario(name, table, rng, duration)
        episode = simulate_episode(table, scenario, seed=int(rng.integers(2**31)))
        path = episode_path(Path(out), table, scenario, i)
        write_episode(path, episode)
        paths.append(path)
    return paths
