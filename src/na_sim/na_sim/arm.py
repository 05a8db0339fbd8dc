"""A simulated arm: MuJoCo rigid-body dynamics with a ``ServoBank`` behind every joint.

``SimulatedArm`` implements the bus emulators' ``ArmBackend`` (thread-safe), steps faster than
real time for datasets (``advance``) and runs in real time on a thread behind an emulator
(``start``/``stop``). It also carries the scenario hooks that give synthetic data its ground truth:
a payload of known mass at the grasp site, a known world-frame push at the end effector, a rigid
surface touched through MuJoCo contact (truth from the solver), and a restricted joint.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

import mujoco
import numpy as np

from na_description.robot_table import RobotTable, load_robot
from na_sim.actuator import ServoBank, ServoParams
from na_sim.bus.backend import ServoState

GRAVITY = 9.81
PAYLOAD_BODY = "na_payload"
PROBE_GEOM = "na_contact_probe"
SURFACE_GEOM = "na_surface"
CONTACT_GROUP = 2          # collision bit shared only by the probe and the scenario surface
PAYLOAD_RADIUS = 0.02      # m, sphere used for the payload's inertia
PROBE_RADIUS = 0.008       # m, contact probe sphere at the grasp site
JAW_STIFFNESS = 100.0      # N.m/rad of a held object against the gripper (servo stall ~3 N.m: < 2 deg give)
JAW_DAMPING = 1.0          # N.m.s/rad
SURFACE_HALF_THICKNESS = 0.05
FAR_AWAY = -10.0           # m, z of the surface while no scenario uses it
PANDA_TCP_OFFSET = 0.1034  # m along panda_hand z (Franka's flange-to-fingertip centre)


@dataclass
class GroundTruth:
    """What the sensors cannot see, for one instant (robot-table joint order)."""

    joint_torque: np.ndarray     # [J] N.m the actuators deliver to the links (after gearbox losses)
    external_force: np.ndarray   # [3] N on the end effector, world frame (payload weight, push, contact)
    contact: bool                # |external_force| > 0.01 N (the gate label of method.md)
    condition: np.ndarray        # [J] 1 normal, 0 restricted


def _robot(robot: str | RobotTable) -> RobotTable:
    return load_robot(robot) if isinstance(robot, str) else robot


def _panda_spec(robot: RobotTable) -> mujoco.MjSpec:
    """example-robot-data's Panda URDF without meshes (MuJoCo cannot read .dae); fingers fixed."""
    text = robot.description_path("urdf").read_text()
    text = re.sub(r"<visual>.*?</visual>", "", text, flags=re.S)
    text = re.sub(r"<collision>.*?</collision>", "", text, flags=re.S)
    text = re.sub(r'(<joint name="panda_finger_joint\d" type=")prismatic', r"\1fixed", text)
    text = re.sub(r"(<robot[^>]*>)", r'\1<mujoco><compiler discardvisual="true" fusestatic="false"/></mujoco>',
                  text, count=1)
    return mujoco.MjSpec.from_string(text)


def build_spec(robot: str | RobotTable, params: ServoParams | None = None) -> mujoco.MjSpec:
    """The robot's MuJoCo model prepared for the servo model: no MJCF actuators or joint friction
    (the ServoBank provides them), armature = the servo rotor inertia, a payload body and a contact
    probe at the grasp site, and a scenario surface parked out of reach."""
    table = _robot(robot)
    params = params or ServoParams.from_robot(table)
    spec = _panda_spec(table) if table.name == "panda" else mujoco.MjSpec.from_file(
        str(table.description_path("mjcf")))
    for actuator in list(spec.actuators):
        spec.delete(actuator)
    spec.option.timestep = 0.001
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    armature = np.broadcast_to(np.asarray(params.rotor_inertia, float), (table.n_joints,))
    for index, name in enumerate(table.joint_names):
        joint = spec.joint(name)
        if joint is None:
            raise ValueError(f"{table.name}: joint {name!r} is not in the MuJoCo description")
        joint.damping = np.zeros_like(np.atleast_1d(joint.damping))
        joint.frictionloss, joint.armature = 0.0, float(armature[index])
    for geom in spec.geoms:
        geom.contype, geom.conaffinity = 0, 0
    site_name = table.frames.get("grasp_site", "")
    site = spec.site(site_name) if site_name else None
    if site is None:
        body = spec.body(site_name)
        if body is None:
            raise ValueError(f"{table.name}: grasp site {site_name!r} is neither a site nor a body")
        offset = [0.0, 0.0, PANDA_TCP_OFFSET] if table.name == "panda" else [0.0, 0.0, 0.0]
        site = body.add_site(name="na_grasp_site", pos=offset)
    parent = site.parent
    payload = parent.add_body(name=PAYLOAD_BODY, pos=site.pos, quat=site.quat)
    payload.mass = 0.0
    payload.inertia = [0.0, 0.0, 0.0]
    payload.explicitinertial = True
    parent.add_geom(name=PROBE_GEOM, type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[PROBE_RADIUS, 0, 0], pos=site.pos,
                    contype=CONTACT_GROUP, conaffinity=CONTACT_GROUP, mass=0.0, group=3,
                    condim=3, friction=[0.8, 0.005, 0.0001])
    spec.worldbody.add_geom(name=SURFACE_GEOM, type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.3, 0.3, SURFACE_HALF_THICKNESS],
                            pos=[0.0, 0.0, FAR_AWAY], contype=CONTACT_GROUP, conaffinity=CONTACT_GROUP,
                            group=3, solref=[0.004, 1.0])
    return spec


@cache
def _compiled(robot_name: str, armature: tuple[float, ...]) -> mujoco.MjModel:
    """Compiled once per robot and rotor inertia (the only servo parameter the model holds)."""
    table = load_robot(robot_name)
    return build_spec(table, ServoParams.from_robot(table, rotor_inertia=np.asarray(armature))).compile()


class SimulatedArm:
    """MuJoCo arm + servo physics; an ``ArmBackend`` for the bus emulators."""

    def __init__(self, robot: str | RobotTable, seed: int = 0, params: ServoParams | None = None,
                 initial_position: np.ndarray | None = None, gravity_compensation: bool | None = None) -> None:
        self.robot = _robot(robot)
        self.params = params or ServoParams.from_robot(self.robot)
        armature = np.broadcast_to(np.asarray(self.params.rotor_inertia, float), (self.robot.n_joints,))
        self.model = _copy_model(_compiled(self.robot.name, tuple(float(a) for a in armature)))
        self.data = mujoco.MjData(self.model)
        self.rng = np.random.default_rng(seed)
        self.bank = ServoBank(self.params, self.robot.n_joints, self.rng, self.model.opt.timestep)
        self._last_drive: tuple[np.ndarray, np.ndarray] | None = None   # (torque, viscous torque)
        self.lock = threading.RLock()   # held while stepping; take it to change several things at once
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Torque-controlled arms (the Panda's joint impedance controller) compensate gravity.
        self.gravity_compensation = (self.robot.bus.family == "franka_ros2"
                                     if gravity_compensation is None else gravity_compensation)
        m = self.model
        self._qadr = np.array([m.jnt_qposadr[m.joint(n).id] for n in self.robot.joint_names])
        self._dofadr = np.array([m.jnt_dofadr[m.joint(n).id] for n in self.robot.joint_names])
        # Gearbox stiction: MuJoCo's dry friction is a soft constraint that lets a loaded joint creep;
        # the stiffest stable setting (time constant of two steps) holds like a real servo gearbox.
        m.dof_solref[self._dofadr, 0] = 2.0 * m.opt.timestep
        self._dof_to_joint = np.full(m.nv, -1, dtype=int)
        self._dof_to_joint[self._dofadr] = np.arange(self.robot.n_joints)
        self._payload_body = m.body(PAYLOAD_BODY).id
        self._probe_geom = m.geom(PROBE_GEOM).id
        self._surface_geom = m.geom(SURFACE_GEOM).id
        self.payload_mass = 0.0
        self.push_force = np.zeros(3)
        self.grasp_stop: tuple[float, float] | None = None  # (jaw angle of the held object, closing sign)
        self._gripper = self.robot.joint_index(self.robot.gripper_joint) if self.robot.gripper_joint else None
        self.condition = np.ones(self.robot.n_joints)
        q0 = np.zeros(self.robot.n_joints) if initial_position is None else np.asarray(initial_position, float)
        self.reset(q0)

    # -- state -----------------------------------------------------------------------------------
    @property
    def n_joints(self) -> int:
        return self.robot.n_joints

    @property
    def time(self) -> float:
        return float(self.data.time)

    @property
    def timestep(self) -> float:
        return float(self.model.opt.timestep)

    def joint_positions(self) -> np.ndarray:
        return self.data.qpos[self._qadr].copy()

    def joint_velocities(self) -> np.ndarray:
        return self.data.qvel[self._dofadr].copy()

    def reset(self, q: np.ndarray) -> None:
        """At rest at joint angles ``q`` (clipped to the limits), goals = ``q``, time 0."""
        with self.lock:
            q = np.clip(np.asarray(q, float), self.robot.position_min, self.robot.position_max)
            mujoco.mj_resetData(self.model, self.data)
            self.data.qpos[self._qadr] = q
            mujoco.mj_forward(self.model, self.data)
            self.bank.reset(q)
            self._last_drive = None

    # -- ArmBackend ------------------------------------------------------------------------------
    def servo_states(self) -> list[ServoState]:
        with self.lock:
            r = self.bank.readings()
            return [ServoState(float(r.position[j]), float(r.velocity[j]), float(r.load[j]),
                               float(r.current[j]), float(r.voltage[j]), float(r.temperature[j]),
                               bool(r.moving[j]), int(r.error[j])) for j in range(self.n_joints)]

    def set_goal_positions(self, goals: Mapping[int, float]) -> None:
        with self.lock:
            for joint, goal in goals.items():
                if not 0 <= joint < self.n_joints:
                    raise IndexError(f"{self.robot.name} has no joint index {joint}")
                if np.isfinite(goal):
                    self.bank.goal[joint] = float(np.clip(goal, self.robot.position_min[joint],
                                                          self.robot.position_max[joint]))

    def set_goal_vector(self, goals: np.ndarray) -> None:
        """All goals at once (rad, robot-table order); NaN entries keep their previous goal."""
        self.set_goal_positions({j: float(g) for j, g in enumerate(goals)})

    def set_torque_enabled(self, joint: int, enabled: bool) -> None:
        with self.lock:
            self.bank.set_torque(joint, enabled)

    def set_gains(self, joint: int, p_gain: float | None = None, d_gain: float | None = None) -> None:
        """Position-loop gains in register units (what a P/D coefficient write sets)."""
        with self.lock:
            if p_gain is not None:
                self.bank.p_gain[joint] = p_gain
            if d_gain is not None:
                self.bank.d_gain[joint] = d_gain

    # -- scenario hooks --------------------------------------------------------------------------
    def set_payload(self, mass_kg: float) -> None:
        """Hang a point-like payload of ``mass_kg`` at the grasp site (0 = release it)."""
        if not mass_kg >= 0.0:
            raise ValueError(f"payload mass must be >= 0 kg, got {mass_kg}")
        with self.lock:
            self.payload_mass = float(mass_kg)
            self.model.body_mass[self._payload_body] = mass_kg
            self.model.body_inertia[self._payload_body] = 0.4 * mass_kg * PAYLOAD_RADIUS**2

    def set_grasp(self, object_angle: float | None, closing_sign: float = -1.0) -> None:
        """An object between the jaws stops the gripper at ``object_angle`` (rad) when it closes (towards
        ``closing_sign``); the servo then pushes against it, as on a real grasp. None removes it."""
        if object_angle is not None and self._gripper is None:
            raise ValueError(f"{self.robot.name} has no gripper joint")
        with self.lock:
            self.grasp_stop = None if object_angle is None else (float(object_angle), float(np.sign(closing_sign)))

    def set_push(self, force_world: np.ndarray | None) -> None:
        """A known world-frame force (N) at the grasp site; None or zeros ends the push."""
        with self.lock:
            self.push_force = np.zeros(3) if force_world is None else np.asarray(force_world, float).copy()

    def set_surface(self, height: float | None, center_xy: tuple[float, float] | None = None) -> None:
        """A rigid horizontal 0.6 m square surface whose top is at ``height`` (m, world z), centred
        at ``center_xy`` (default: under the grasp site now); None removes it."""
        with self.lock:
            if center_xy is None:
                center_xy = tuple(self.data.xpos[self._payload_body][:2])
            half = self.model.geom_size[self._surface_geom][2]
            if height is None:
                self.model.geom_pos[self._surface_geom] = [0.0, 0.0, FAR_AWAY]
            else:
                self.model.geom_pos[self._surface_geom] = [center_xy[0], center_xy[1], height - half]

    def set_restriction(self, joint: int, extra_friction_nm: float) -> None:
        """Extra gearbox friction on ``joint`` (a degraded/restricted motor); 0 restores it."""
        with self.lock:
            self.bank.extra_friction[joint] = max(0.0, float(extra_friction_nm))
            self.condition[joint] = 0.0 if extra_friction_nm > 0 else 1.0

    def grasp_position(self) -> np.ndarray:
        """World position of the grasp site (where payloads hang and pushes act)."""
        with self.lock:
            return self.data.xpos[self._payload_body].copy()

    # -- stepping --------------------------------------------------------------------------------
    def step(self, n: int = 1) -> None:
        """Advance ``n`` physics steps (timestep seconds each)."""
        with self.lock:
            for _ in range(n):
                self._step_once()

    def advance(self, seconds: float) -> None:
        self.step(max(1, round(seconds / self.timestep)))

    def _step_once(self) -> None:
        m, d, dof = self.model, self.data, self._dofadr
        q, qd = d.qpos[self._qadr], d.qvel[dof]
        if self.gravity_compensation:
            self.bank.feedforward = d.qfrc_bias[dof].copy()
        torque, friction, viscous = self.bank.step(q, qd)
        d.qfrc_applied[dof] = torque
        if self.grasp_stop is not None:
            d.qfrc_applied[dof[self._gripper]] += self._jaw_stop_torque(q[self._gripper], qd[self._gripper])
        m.dof_frictionloss[dof] = friction
        m.dof_damping[dof] = viscous
        d.xfrc_applied[self._payload_body] = 0.0
        if np.any(self.push_force):
            # xfrc_applied acts at the body's centre of mass: add the moment of the offset.
            body = self._payload_body
            d.xfrc_applied[body, :3] = self.push_force
            d.xfrc_applied[body, 3:] = np.cross(d.xpos[body] - d.xipos[body], self.push_force)
        self._last_drive = (torque, viscous * qd)     # truth is derived from it lazily (truth())
        mujoco.mj_step(m, d)

    def _jaw_stop_torque(self, angle: float, rate: float) -> float:
        """One-sided spring-damper of a held object on the gripper joint (0 while the jaws are open wider)."""
        object_angle, closing = self.grasp_stop
        depth = closing * (angle - object_angle)
        if depth <= 0.0:
            return 0.0
        push = JAW_STIFFNESS * depth + JAW_DAMPING * closing * rate
        return -closing * max(push, 0.0)

    def _compute_truth(self) -> GroundTruth:
        """Truth of the last step: constraint forces in ``data`` still belong to it until the next."""
        torque, viscous_torque = self._last_drive
        d = self.data
        delivered = torque - viscous_torque
        nefc = d.nefc
        rows = np.nonzero(d.efc_type[:nefc] == mujoco.mjtConstraint.mjCNSTR_FRICTION_DOF)[0]
        joints = self._dof_to_joint[d.efc_id[rows]]
        mine = joints >= 0
        np.add.at(delivered, joints[mine], d.efc_force[rows[mine]])
        force = self.push_force + np.array([0.0, 0.0, -GRAVITY * self.payload_mass])
        force = force + self._contact_force()
        return GroundTruth(delivered, force, bool(np.linalg.norm(force) > 0.01), self.condition.copy())

    def _contact_force(self) -> np.ndarray:
        """World-frame force the scenario surface exerts on the probe (from the constraint solver)."""
        total = np.zeros(3)
        wrench = np.zeros(6)
        for i in range(self.data.ncon):
            contact = self.data.contact[i]
            geoms = (contact.geom1, contact.geom2)
            if self._probe_geom not in geoms or self._surface_geom not in geoms:
                continue
            mujoco.mj_contactForce(self.model, self.data, i, wrench)
            world = contact.frame.reshape(3, 3).T @ wrench[:3]
            # The contact frame's normal points from geom1 to geom2; the force is on geom2.
            total += world if contact.geom2 == self._probe_geom else -world
        return total

    def truth(self) -> GroundTruth:
        """Ground truth at the end of the last physics step."""
        with self.lock:
            if self._last_drive is None:
                n = self.n_joints
                return GroundTruth(np.zeros(n), np.zeros(3), False, self.condition.copy())
            return self._compute_truth()

    # -- real time -------------------------------------------------------------------------------
    def start(self, rate: float = 1.0) -> None:
        """Run the physics on a thread, ``rate`` x real time, until ``stop``."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(rate,), name=f"sim-{self.robot.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _run(self, rate: float) -> None:
        start_wall, start_sim = time.monotonic(), self.time
        period = 0.002
        while not self._stop.is_set():
            target = start_sim + (time.monotonic() - start_wall) * rate
            behind = int((target - self.time) / self.timestep)
            if behind > 0:
                self.step(min(behind, 20))    # short chunks (a few ms) keep the lock free for bus reads
            else:
                self._stop.wait(period)


def _copy_model(model: mujoco.MjModel) -> mujoco.MjModel:
    """A private copy: scenarios change masses, friction and geometry per arm."""
    import copy

    return copy.deepcopy(model)


def measure_real_time_factor(robot: str, seconds: float = 2.0, seed: int = 0) -> float:
    """Simulated seconds per wall-clock second of ``SimulatedArm.advance`` (full servo physics)."""
    arm = SimulatedArm(robot, seed=seed)
    arm.set_goal_vector(np.asarray(arm.robot.position_min) * 0.2)
    start = time.perf_counter()
    arm.advance(seconds)
    return seconds / (time.perf_counter() - start)
