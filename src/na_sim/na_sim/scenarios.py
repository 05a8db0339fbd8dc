"""Scenarios: a leader trajectory plus timed events whose truth the simulator knows exactly.

Leader trajectories: pick-and-place, go-up-and-stay, joint sweeps, smooth random motion, idle.
Events: payload attach/detach at the grasp site (known mass), the held object stopping the gripper's
jaws (``sim_scenarios.gripper_object``), pushes at the end effector (known
world-frame force), a rigid surface pressed through MuJoCo contact, a restricted joint (extra gearbox
friction = the motor-condition label). Everything is drawn from a numpy Generator, so a scenario is
deterministic per seed. Robot-specific choices (payload masses, push size, gripper open/closed)
come from the robot table's ``sim_scenarios`` section.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mujoco
import numpy as np

from na_description.robot_table import RobotTable, load_robot

SCENARIOS = ("idle", "smooth_random", "joint_sweep", "pick_and_place", "go_up_and_stay", "push", "contact",
             "restricted")
DEFAULTS: dict[str, Any] = {
    "payloads_kg": [0.3, 0.4, 0.5],
    "push_newton": [1.0, 4.0],
    "gripper_open": None,      # rad; None: 70 % of the gripper range
    "gripper_closed": None,    # rad; None: 20 % of the gripper range
    "gripper_object": None,    # rad: jaw angle at which a picked object stops the gripper (None: no stop)
    "restriction_nm": [0.3, 0.8],   # N.m extra friction: several times the healthy joint's
    "motion_fraction": 0.35,   # fraction of each joint's half range used by random motions
}


@dataclass
class Event:
    """Something that happens to the arm at ``time`` (s): payload kg, grasp (object jaw angle rad, closing
    sign) or None, push N (3), surface (top z, x, y) m, restriction (joint, N.m)."""

    time: float
    kind: str
    value: Any


@dataclass
class Scenario:
    name: str
    robot: str
    duration: float
    goal: Callable[[float], np.ndarray]
    events: list[Event] = field(default_factory=list)
    initial_position: np.ndarray | None = None
    payload_kg: float | None = None
    restricted_joint: int | None = None

    def events_between(self, t0: float, t1: float) -> list[Event]:
        """Events with t0 < time <= t1 (and time == 0 when t0 < 0)."""
        return [e for e in self.events if t0 < e.time <= t1]

    def apply(self, arm: Any, t0: float, t1: float) -> None:
        """Fire the events of (t0, t1] on a ``SimulatedArm``."""
        for event in self.events_between(t0, t1):
            apply_event(arm, event)


def apply_event(arm: Any, event: Event) -> None:
    if event.kind == "payload":
        arm.set_payload(float(event.value))
    elif event.kind == "grasp":
        if event.value is None:
            arm.set_grasp(None)
        else:
            arm.set_grasp(*event.value)
    elif event.kind == "push":
        arm.set_push(None if event.value is None else np.asarray(event.value, float))
    elif event.kind == "surface_below":
        # A surface ``value`` m under the probe's lowest point, wherever the arm hovers right now.
        from na_sim.arm import PROBE_RADIUS

        arm.set_surface(float(arm.grasp_position()[2]) - PROBE_RADIUS - float(event.value))
    elif event.kind == "surface":
        if event.value is None:
            arm.set_surface(None)
        else:
            height, x, y = event.value
            arm.set_surface(float(height), (float(x), float(y)))
    elif event.kind == "restrict":
        joint, torque = event.value
        arm.set_restriction(int(joint), float(torque))
    else:
        raise ValueError(f"unknown scenario event {event.kind!r}")


def scenario_settings(robot: RobotTable) -> dict[str, Any]:
    return {**DEFAULTS, **robot.raw.get("sim_scenarios", {})}


def gripper_value(robot: RobotTable, which: str) -> float:
    """The gripper's ``open`` or ``closed`` command (rad) of the robot's scenario settings."""
    joint = robot.joint_index(robot.gripper_joint)
    lo, hi = robot.position_min[joint], robot.position_max[joint]
    value = scenario_settings(robot)[f"gripper_{which}"]
    if value is None:
        value = lo + (0.7 if which == "open" else 0.2) * (hi - lo)
    return float(np.clip(value, lo, hi))


def grasp_events(robot: RobotTable, reach: float, release: float) -> list[Event]:
    """The held object between the jaws from ``reach`` to ``release`` (none without ``gripper_object``)."""
    object_angle = scenario_settings(robot)["gripper_object"]
    if robot.gripper_joint is None or object_angle is None:
        return []
    closing = float(np.sign(gripper_value(robot, "closed") - gripper_value(robot, "open")))
    return [Event(reach, "grasp", (float(object_angle), closing)), Event(release, "grasp", None)]


def home_position(robot: RobotTable) -> np.ndarray:
    """Middle of every joint's range: a safe, non-singular start for all three arms."""
    return 0.5 * (np.asarray(robot.position_min) + np.asarray(robot.position_max))


def _min_jerk(s: np.ndarray | float) -> np.ndarray | float:
    s = np.clip(s, 0.0, 1.0)
    return s**3 * (10 - 15 * s + 6 * s**2)


def waypoint_path(times: list[float], poses: list[np.ndarray]) -> Callable[[float], np.ndarray]:
    """Minimum-jerk segments through ``poses`` reached at ``times`` (held before/after)."""
    times_a = np.asarray(times, float)
    poses_a = np.asarray(poses, float)

    def goal(t: float) -> np.ndarray:
        if t <= times_a[0]:
            return poses_a[0].copy()
        if t >= times_a[-1]:
            return poses_a[-1].copy()
        k = int(np.searchsorted(times_a, t, side="right")) - 1
        s = (t - times_a[k]) / (times_a[k + 1] - times_a[k])
        return poses_a[k] + (poses_a[k + 1] - poses_a[k]) * _min_jerk(s)

    return goal


class _Builder:
    """Draws scenario ingredients for one robot from one Generator."""

    def __init__(self, robot: RobotTable, rng: np.random.Generator) -> None:
        self.robot = robot
        self.rng = rng
        self.cfg = scenario_settings(robot)
        self.lo = np.asarray(robot.position_min)
        self.hi = np.asarray(robot.position_max)
        self.home = home_position(robot)
        self.half = 0.5 * (self.hi - self.lo)
        self.gripper = robot.joint_index(robot.gripper_joint) if robot.gripper_joint else None

    def gripper_value(self, which: str) -> float:
        assert self.gripper is not None
        return gripper_value(self.robot, which)

    def random_pose(self, fraction: float | None = None) -> np.ndarray:
        fraction = self.cfg["motion_fraction"] if fraction is None else fraction
        pose = self.home + self.rng.uniform(-1.0, 1.0, self.robot.n_joints) * self.half * fraction
        if self.gripper is not None:
            pose[self.gripper] = self.gripper_value("open")
        return np.clip(pose, self.lo, self.hi)

    def payload(self) -> float:
        return float(self.rng.choice(self.cfg["payloads_kg"]))

    def smooth_random(self, duration: float) -> Callable[[float], np.ndarray]:
        n = self.robot.n_joints
        freqs = self.rng.uniform(0.05, 0.4, (3, n))
        phases = self.rng.uniform(0, 2 * np.pi, (3, n))
        amps = self.rng.uniform(0.2, 0.5, (3, n)) * self.half * self.cfg["motion_fraction"]
        center = self.random_pose(0.3)
        ramp = 2.0

        def goal(t: float) -> np.ndarray:
            wave = np.sum(amps * (np.sin(2 * np.pi * freqs * t + phases) - np.sin(phases)), axis=0)
            return np.clip(self.home + (center - self.home + wave) * _min_jerk(t / ramp), self.lo, self.hi)

        return goal


def make_scenario(name: str, robot: str | RobotTable, rng: np.random.Generator | int = 0,
                  duration: float | None = None) -> Scenario:
    """Build scenario ``name`` (one of SCENARIOS) for ``robot`` from ``rng`` (or a seed)."""
    table = load_robot(robot) if isinstance(robot, str) else robot
    rng = np.random.default_rng(rng) if isinstance(rng, (int, np.integer)) else rng
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
    b = _Builder(table, rng)
    home = b.home
    if name == "idle":
        d = duration or 5.0
        return Scenario(name, table.name, d, waypoint_path([0.0], [home]), initial_position=home)
    if name == "smooth_random":
        d = duration or 20.0
        return Scenario(name, table.name, d, b.smooth_random(d), initial_position=home)
    if name == "joint_sweep":
        times, poses, t = [0.0], [home], 0.5
        arm_joints = [j for j in range(table.n_joints) if j != b.gripper]
        for j in arm_joints:
            for target in (0.6, -0.6, 0.0):
                pose = home.copy()
                pose[j] = home[j] + target * b.half[j] * b.cfg["motion_fraction"] * 2
                t += rng.uniform(1.0, 2.0)
                times.append(t)
                poses.append(np.clip(pose, b.lo, b.hi))
        return Scenario(name, table.name, duration or t + 1.0, waypoint_path(times, poses), initial_position=home)
    if name in ("pick_and_place", "go_up_and_stay"):
        return _pick(b, name, duration)
    if name == "push":
        d = duration or 12.0
        events, t = [], 1.5
        low, high = b.cfg["push_newton"]
        while t < d - 1.5:
            direction = rng.normal(size=3)
            direction /= np.linalg.norm(direction)
            force = direction * rng.uniform(low, high)
            events.append(Event(t, "push", force))
            t += rng.uniform(0.5, 2.0)
            events.append(Event(t, "push", None))
            t += rng.uniform(0.5, 1.5)
        pose = b.random_pose(0.3)
        return Scenario(name, table.name, d, waypoint_path([0.0, 1.0], [home, pose]), events, initial_position=home)
    if name == "contact":
        return _contact(b, table, duration)
    # restricted: smooth random motion with extra friction on one arm joint for the whole episode
    d = duration or 20.0
    candidates = [j for j in range(table.n_joints) if j != b.gripper]
    joint = int(rng.choice(candidates))
    torque = float(rng.uniform(*b.cfg["restriction_nm"]))
    return Scenario(name, table.name, d, b.smooth_random(d), [Event(0.0, "restrict", (joint, torque))],
                    initial_position=home, restricted_joint=joint)


def _pick(b: _Builder, name: str, duration: float | None) -> Scenario:
    """Reach, close the gripper (payload attached), lift, then place it (or hold it up and stay)."""
    rng, home = b.rng, b.home
    mass = b.payload()
    pick, place, up = b.random_pose(), b.random_pose(), b.random_pose(0.5)
    closed = pick.copy()
    if b.gripper is not None:
        closed[b.gripper] = b.gripper_value("closed")
    t = [0.0]
    poses = [home]

    def go(pose: np.ndarray, seconds: float) -> float:
        t.append(t[-1] + seconds)
        poses.append(pose)
        return t[-1]

    reach = go(pick, rng.uniform(1.5, 2.5))
    attach = go(closed, 0.6)
    if name == "go_up_and_stay":
        lifted = up.copy()
        if b.gripper is not None:
            lifted[b.gripper] = closed[b.gripper]
        go(lifted, rng.uniform(1.5, 2.5))
        go(lifted, rng.uniform(4.0, 8.0))
        go(closed, rng.uniform(1.5, 2.5))
        detach = go(pick, 0.6)
    else:
        carry = place.copy()
        if b.gripper is not None:
            carry[b.gripper] = closed[b.gripper]
        go(carry, rng.uniform(2.0, 3.5))
        detach = go(place, 0.6)
    go(home, rng.uniform(1.5, 2.5))
    # the object is between the jaws from the reach on: closing stops on it until the release
    events = sorted([Event(attach, "payload", mass), Event(detach, "payload", 0.0),
                     *grasp_events(b.robot, reach, detach)], key=lambda e: e.time)
    d = max(duration or 0.0, t[-1] + 1.0)
    return Scenario(name, b.robot.name, d, waypoint_path(t, poses), events, initial_position=home, payload_kg=mass)


def _contact(b: _Builder, table: RobotTable, duration: float | None) -> Scenario:
    """Hover, then a rigid surface appears 2 mm under the probe; press down onto it a few times."""
    from na_sim.arm import build_spec  # the same model the arm uses, for kinematics only

    model = build_spec(table).compile()
    data = mujoco.MjData(model)
    qadr = [model.jnt_qposadr[model.joint(n).id] for n in table.joint_names]
    dofadr = [model.jnt_dofadr[model.joint(n).id] for n in table.joint_names]
    site = model.body("na_payload").id
    pose = b.random_pose(0.25)
    data.qpos[qadr] = pose
    mujoco.mj_forward(model, data)
    jac = np.zeros((3, model.nv))
    mujoco.mj_jacBody(model, data, jac, None, site)
    jz = jac[2, dofadr]
    times, poses = [0.0, 1.5], [b.home, pose]
    t = 2.5                                               # settled at the hover pose
    events = [Event(t, "surface_below", 0.002)]
    for _ in range(3):
        depth = b.rng.uniform(0.01, 0.03)                # commanded penetration (m): the servos press
        press = pose + jz * -(depth + 0.002) / max(float(jz @ jz), 1e-9)
        times += [t + 1.0, t + 2.5, t + 3.5]
        poses += [np.clip(press, b.lo, b.hi)] * 2 + [pose]
        t += 3.5
    d = max(duration or 0.0, t + 1.0)
    return Scenario("contact", table.name, d, waypoint_path(times, poses), events, initial_position=b.home)
