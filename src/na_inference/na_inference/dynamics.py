"""Differentiable rigid-body dynamics of a robot arm in torch (training only; never imported at run time).

The torque surrogate is trained without torque labels by rolling the predicted torques through a
simulator and comparing the simulated joints with the recorded ones (method.md), so the simulator has to
be differentiable, batched and cheap on a CPU. This module is our own: the kinematic tree and inertias
are read once from the robot's MJCF through ``mujoco.MjModel`` (the same numbers MuJoCo itself uses),
then everything runs in torch in the world frame:

* RNEA (recursive Newton-Euler) gives the bias forces C(q, qd) qd + g(q),
* CRBA (composite rigid bodies) gives the joint-space mass matrix M(q) (+ the actuator armature),
* a Cholesky solve gives the forward dynamics qdd = M^-1 (tau + J^T f - bias - damping - friction),
* semi-implicit Euler with substeps integrates it, with the torque clipped to the actuator limit.

Spatial vectors are 6-vectors [angular; linear] expressed at the world origin, so no frame transforms
are needed between bodies. Bodies carry zero or one hinge/slide joint; joints of the description that
are not in the robot table are locked at their reference position. Dry friction is the smooth
``frictionloss * tanh(qd / friction_velocity)`` (MuJoCo solves it as a constraint, which is not smooth).
"""

from __future__ import annotations

import logging
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from na_description.robot_table import RobotTable, load_robot

log = logging.getLogger(__name__)

HINGE, SLIDE, FIXED = 3, 2, -1  # MuJoCo's mjJNT_HINGE / mjJNT_SLIDE; FIXED = no (or a locked) joint


class DynamicsError(ValueError):
    """The description holds something this module cannot simulate (free/ball joints, several joints in a body)."""


@dataclass(frozen=True)
class ChainDescription:
    """Kinematic tree and inertias in numpy float64, one entry per body except the world body.

    ``parent`` indexes this list (-1 = world); ``dof`` is the generalized coordinate index of the body's
    joint (-1 for a fixed body). Local poses follow MuJoCo: body frame = parent frame * (pos, rot), then
    the joint rotates (hinge) or translates (slide) about ``joint_axis`` through ``joint_pos``.
    """

    body_names: tuple[str, ...]
    parent: np.ndarray        # [nb] int
    pos: np.ndarray           # [nb, 3]
    rot: np.ndarray           # [nb, 3, 3]
    joint_type: np.ndarray    # [nb] int (HINGE, SLIDE, FIXED)
    joint_axis: np.ndarray    # [nb, 3]
    joint_pos: np.ndarray     # [nb, 3]
    joint_ref: np.ndarray     # [nb] qpos0 (hinge/slide) or the locked value
    dof: np.ndarray           # [nb] int
    mass: np.ndarray          # [nb]
    inertia_pos: np.ndarray   # [nb, 3] centre of mass in the body frame
    inertia_rot: np.ndarray   # [nb, 3, 3] principal axes in the body frame
    inertia_diag: np.ndarray  # [nb, 3] principal moments
    joint_names: tuple[str, ...]  # one per dof, in dof order
    armature: np.ndarray      # [n]
    damping: np.ndarray       # [n]
    frictionloss: np.ndarray  # [n]
    gravity: np.ndarray       # [3]
    site_body: int            # body index carrying the force site (-1: none)
    site_pos: np.ndarray      # [3] in that body's frame

    @property
    def n_dof(self) -> int:
        return len(self.joint_names)


def _quat_to_matrix(quat: np.ndarray) -> np.ndarray:
    w, x, y, z = np.asarray(quat, dtype=np.float64) / np.linalg.norm(quat)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def chain_from_mjmodel(model, joint_names: tuple[str, ...] | None = None, site: str | None = None) -> ChainDescription:
    """Read the tree of a ``mujoco.MjModel``; ``joint_names`` picks (and orders) the simulated joints."""
    import mujoco

    all_joints = tuple(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(model.njnt))
    wanted = tuple(joint_names) if joint_names is not None else all_joints
    missing = [name for name in wanted if name not in all_joints]
    if missing:
        raise DynamicsError(f"joints {missing} are not in the description (it has {list(all_joints)})")
    nb = model.nbody - 1
    parent = np.asarray(model.body_parentid[1:], dtype=np.int64) - 1
    joint_type = np.full(nb, FIXED, dtype=np.int64)
    axis = np.zeros((nb, 3))
    jpos = np.zeros((nb, 3))
    ref = np.zeros(nb)
    dof = np.full(nb, -1, dtype=np.int64)
    for b in range(nb):
        count, first = int(model.body_jntnum[b + 1]), int(model.body_jntadr[b + 1])
        if count == 0:
            continue
        if count > 1:
            raise DynamicsError(f"body {model.body(b + 1).name!r} has {count} joints; one per body is supported")
        jtype = int(model.jnt_type[first])
        if jtype not in (HINGE, SLIDE):
            raise DynamicsError(f"joint {all_joints[first]!r} is not a hinge or slide joint (type {jtype})")
        joint_type[b] = jtype
        axis[b] = model.jnt_axis[first]
        jpos[b] = model.jnt_pos[first]
        ref[b] = model.qpos0[model.jnt_qposadr[first]]
        if all_joints[first] in wanted:
            dof[b] = wanted.index(all_joints[first])
    dof_joint = [int(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)) for name in wanted]
    dof_adr = [int(model.jnt_dofadr[j]) for j in dof_joint]
    site_body, site_pos = -1, np.zeros(3)
    if site is not None:
        sid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site)
        if sid < 0:
            raise DynamicsError(f"site {site!r} is not in the description")
        site_body, site_pos = int(model.site_bodyid[sid]) - 1, np.array(model.site_pos[sid], dtype=np.float64)
    return ChainDescription(
        body_names=tuple(model.body(b + 1).name for b in range(nb)),
        parent=parent,
        pos=np.array(model.body_pos[1:], dtype=np.float64),
        rot=np.stack([_quat_to_matrix(q) for q in model.body_quat[1:]]),
        joint_type=joint_type, joint_axis=axis, joint_pos=jpos, joint_ref=ref, dof=dof,
        mass=np.array(model.body_mass[1:], dtype=np.float64),
        inertia_pos=np.array(model.body_ipos[1:], dtype=np.float64),
        inertia_rot=np.stack([_quat_to_matrix(q) for q in model.body_iquat[1:]]),
        inertia_diag=np.array(model.body_inertia[1:], dtype=np.float64),
        joint_names=wanted,
        armature=np.array([model.dof_armature[a] for a in dof_adr], dtype=np.float64),
        damping=np.array([model.dof_damping[a] for a in dof_adr], dtype=np.float64),
        frictionloss=np.array([model.dof_frictionloss[a] for a in dof_adr], dtype=np.float64),
        gravity=np.array(model.opt.gravity, dtype=np.float64),
        site_body=site_body, site_pos=site_pos,
    )


def load_mjmodel(robot: RobotTable):
    """The robot's MJCF (or, without one, its URDF) as a ``mujoco.MjModel``."""
    import mujoco

    kind = "mjcf" if "mjcf" in robot.description else "urdf"
    path: Path = robot.description_path(kind)
    return mujoco.MjModel.from_xml_path(str(path))


def chain_for_robot(robot: str | RobotTable) -> ChainDescription:
    """The chain of a robot table's description: its joints in table order, force at its grasp site."""
    table = load_robot(robot) if isinstance(robot, str) else robot
    return chain_from_mjmodel(load_mjmodel(table), table.joint_names, table.frames.get("grasp_site"))


def _skew(v: torch.Tensor) -> torch.Tensor:
    """[..., 3] -> [..., 3, 3] with skew(a) @ b = a x b."""
    zero = torch.zeros_like(v[..., 0])
    x, y, z = v.unbind(-1)
    return torch.stack([
        torch.stack([zero, -z, y], -1),
        torch.stack([z, zero, -x], -1),
        torch.stack([-y, x, zero], -1),
    ], -2)


def _axis_angle(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [B, 3, 3] about a fixed unit ``axis`` [3] by ``angle`` [B] (Rodrigues)."""
    k = _skew(axis)
    s, c = torch.sin(angle)[:, None, None], torch.cos(angle)[:, None, None]
    eye = torch.eye(3, dtype=axis.dtype, device=axis.device)
    return eye + s * k + (1 - c) * (k @ k)


def _cross_motion(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Spatial motion cross product v x m for [..., 6] vectors [angular; linear]."""
    w, vo = v[..., :3], v[..., 3:]
    return torch.cat([torch.linalg.cross(w, m[..., :3]),
                      torch.linalg.cross(w, m[..., 3:]) + torch.linalg.cross(vo, m[..., :3])], -1)


def _cross_force(v: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Spatial force cross product v x* f for [..., 6] vectors [angular; linear]."""
    w, vo = v[..., :3], v[..., 3:]
    return torch.cat([torch.linalg.cross(w, f[..., :3]) + torch.linalg.cross(vo, f[..., 3:]),
                      torch.linalg.cross(w, f[..., 3:])], -1)


@dataclass
class Kinematics:
    """World poses of every body, joint motion subspaces and spatial inertias for a batch of q."""

    rot: torch.Tensor       # [B, nb, 3, 3]
    pos: torch.Tensor       # [B, nb, 3] body origins
    motion: torch.Tensor    # [B, n, 6] joint motion subspaces at the world origin
    inertia: torch.Tensor   # [B, nb, 6, 6] spatial inertias at the world origin


class RigidBodyDynamics(nn.Module):
    """Batched, differentiable dynamics of a tree of rigid bodies (see the module docstring).

    Only the forward kinematics walks the tree body by body; RNEA and CRBA are written as masked sums over
    ancestors (world-frame spatial vectors need no transforms), a few dozen batched tensor operations
    instead of hundreds of tiny ones: the CPU cost of a simulator substep is dominated by operation count.
    All methods take ``q``, ``qd`` of shape [B, n] in the module's dtype; forces are world-frame N.
    """

    def __init__(self, chain: ChainDescription, torque_limit: float | np.ndarray | None = None,
                 friction_velocity: float = 0.05, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.chain = chain
        self.n = chain.n_dof
        self.friction_velocity = float(friction_velocity)

        def buf(name: str, value: np.ndarray) -> None:
            self.register_buffer(name, torch.tensor(np.array(value, dtype=np.float64)).to(dtype), persistent=False)

        nb = len(chain.parent)
        buf("body_pos", chain.pos)
        buf("body_rot", chain.rot)
        buf("joint_axis", chain.joint_axis)
        buf("joint_pos", chain.joint_pos)
        buf("joint_ref", chain.joint_ref)
        buf("mass", chain.mass)
        buf("inertia_pos", chain.inertia_pos)
        # Rotational inertia about the COM in the body frame: R diag(I) R^T.
        buf("inertia_body", np.einsum("bij,bj,bkj->bik", chain.inertia_rot, chain.inertia_diag, chain.inertia_rot))
        buf("armature", chain.armature)
        buf("damping", chain.damping)
        buf("frictionloss", chain.frictionloss)
        buf("gravity", chain.gravity)
        buf("site_pos", chain.site_pos)
        limit = np.full(self.n, np.inf) if torque_limit is None else np.broadcast_to(np.asarray(torque_limit, float), (self.n,))
        buf("torque_limit", limit)
        self._parents = [int(p) for p in chain.parent]
        self._types = [int(t) for t in chain.joint_type]
        self._dofs = [int(d) for d in chain.dof]
        dof_body = np.zeros(self.n, dtype=np.int64)
        for b, d in enumerate(self._dofs):
            if d >= 0:
                dof_body[d] = b
        ancestor = np.zeros((nb, nb))  # [b, c] = 1 when c is b or an ancestor of b
        for b in range(nb):
            c = b
            while c >= 0:
                ancestor[b, c] = 1.0
                c = self._parents[c]
        self._dof_body = dof_body.tolist()
        buf("moves", ancestor[:, dof_body])                  # [nb, n]: dof j moves body b
        buf("dof_ancestor", ancestor[dof_body][:, dof_body].T)  # [i, j]: dof i is dof j or above it
        self._substep_dynamics = self.forward_dynamics  # what ``step`` calls; see compile_substeps

    def compile_substeps(self) -> bool:
        """Run ``step``'s forward dynamics through ``torch.compile`` (inductor, symbolic batch size).

        Why: a substep is ~150 tiny tensor operations, so eager autograd on a CPU spends its time in
        per-operation overhead; fused C++ kernels make a simulator step ~3x faster, forward and backward
        (na_inference README, "Engineering it for a 2-core CPU"). The first call compiles (about a minute
        cold, ~25 s with inductor's cache under /tmp warm). Without a C++ compiler, or if compilation fails, the eager path is kept with a
        warning, so training never stops over it. Returns whether the compiled path is in use.
        """
        if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
            log.warning("no C++ compiler on PATH: the simulator step stays in eager mode (slower training)")
            return False
        import torch._dynamo  # torch.compile's exceptions live here

        # inductor's own deprecation chatter on every compilation; not actionable for a user
        warnings.filterwarnings("ignore", message=".*torch._prims_common.check.*", category=FutureWarning)

        compiled = torch.compile(self.forward_dynamics, dynamic=True)
        eager = self.forward_dynamics

        def substep(q, qd, tau, force=None):
            try:
                return compiled(q, qd, tau, force)
            except torch._dynamo.exc.BackendCompilerFailed as exc:
                log.warning("torch.compile of the simulator step failed (%s); using eager mode", exc)
                self._substep_dynamics = eager
                return eager(q, qd, tau, force)

        self._substep_dynamics = substep
        return True

    @classmethod
    def for_robot(cls, robot: str | RobotTable, dtype: torch.dtype = torch.float64, **kwargs) -> RigidBodyDynamics:
        """Dynamics of a robot table's description with its actuator torque limit (if the table gives one)."""
        table = load_robot(robot) if isinstance(robot, str) else robot
        kwargs.setdefault("torque_limit", table.actuator.get("torque_limit_nm"))
        return cls(chain_for_robot(table), dtype=dtype, **kwargs)

    # ---------------------------------------------------------------- kinematics
    def kinematics(self, q: torch.Tensor) -> Kinematics:
        batch = q.shape[0]
        eye = torch.eye(3, dtype=q.dtype, device=q.device).expand(batch, 3, 3)
        origin = q.new_zeros(batch, 3)
        rots: list[torch.Tensor] = []
        poss: list[torch.Tensor] = []
        motions: list[torch.Tensor] = [q.new_zeros(batch, 6)] * self.n
        for b, par in enumerate(self._parents):
            rp, pp = (eye, origin) if par < 0 else (rots[par], poss[par])
            rot = rp @ self.body_rot[b]
            pos = pp + rp @ self.body_pos[b]
            jtype, d = self._types[b], self._dofs[b]
            if jtype != FIXED:
                value = (q[:, d] if d >= 0 else q.new_zeros(batch)) - self.joint_ref[b]
                axis_world = rot @ self.joint_axis[b]
                if jtype == HINGE:
                    anchor = pos + rot @ self.joint_pos[b]
                    rot = rot @ _axis_angle(self.joint_axis[b], value)
                    pos = anchor - rot @ self.joint_pos[b]
                    if d >= 0:
                        motions[d] = torch.cat([axis_world, torch.linalg.cross(anchor, axis_world)], -1)
                else:
                    pos = pos + axis_world * value[:, None]
                    if d >= 0:
                        motions[d] = torch.cat([torch.zeros_like(axis_world), axis_world], -1)
            rots.append(rot)
            poss.append(pos)
        rot_all, pos_all = torch.stack(rots, 1), torch.stack(poss, 1)
        return Kinematics(rot_all, pos_all, torch.stack(motions, 1), self._spatial_inertia(rot_all, pos_all))

    def _spatial_inertia(self, rot: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """[B, nb, 6, 6] spatial inertias about the world origin: [[Ic + m cx cx^T, m cx], [m cx^T, m 1]]."""
        m = self.mass[:, None, None]
        com = pos + (rot @ self.inertia_pos[..., None])[..., 0]
        inertia_com = rot @ self.inertia_body @ rot.transpose(-1, -2)
        cx = _skew(com)
        eye = torch.eye(3, dtype=pos.dtype, device=pos.device).expand_as(inertia_com)
        top = torch.cat([inertia_com + m * cx @ cx.transpose(-1, -2), m * cx], -1)
        bottom = torch.cat([m * cx.transpose(-1, -2), m * eye], -1)
        return torch.cat([top, bottom], -2)

    # ---------------------------------------------------------------- dynamics terms
    def rnea(self, q: torch.Tensor, qd: torch.Tensor, qdd: torch.Tensor, kin: Kinematics | None = None) -> torch.Tensor:
        """Inverse dynamics of the rigid bodies: M(q) qdd + C(q, qd) qd + g(q) (no armature/damping/friction)."""
        kin = kin or self.kinematics(q)
        s = kin.motion
        s_rate = s * qd[..., None]                                        # [B, n, 6]
        vel = torch.einsum("cj,bjd->bcd", self.moves, s_rate)             # body velocities [B, nb, 6]
        bias_acc = _cross_motion(vel[:, self._dof_body], s_rate) + s * qdd[..., None]
        base_acc = torch.cat([torch.zeros_like(self.gravity), -self.gravity])
        acc = base_acc + torch.einsum("cj,bjd->bcd", self.moves, bias_acc)  # [B, nb, 6]
        inertia = kin.inertia
        force = (inertia @ acc[..., None])[..., 0] + _cross_force(vel, (inertia @ vel[..., None])[..., 0])
        subtree = torch.einsum("cj,bcd->bjd", self.moves, force)         # force carried by each joint
        return (s * subtree).sum(-1)

    def bias_forces(self, q: torch.Tensor, qd: torch.Tensor, kin: Kinematics | None = None) -> torch.Tensor:
        """C(q, qd) qd + g(q), MuJoCo's ``qfrc_bias``."""
        return self.rnea(q, qd, torch.zeros_like(qd), kin)

    def mass_matrix(self, q: torch.Tensor, kin: Kinematics | None = None, armature: bool = True) -> torch.Tensor:
        """Joint-space inertia M(q) by CRBA [B, n, n]; with ``armature`` it matches MuJoCo's ``mj_fullM``."""
        kin = kin or self.kinematics(q)
        composite = torch.einsum("cj,bcxy->bjxy", self.moves, kin.inertia)  # subtree inertia per joint
        force = (composite @ kin.motion[..., None])[..., 0]                 # [B, n, 6]
        gram = torch.einsum("bid,bjd->bij", kin.motion, force)              # S_i . Ic_j S_j
        upper = gram * self.dof_ancestor                                     # valid where i is above j
        mass = upper + upper.transpose(1, 2) - torch.diag_embed(torch.diagonal(gram, dim1=1, dim2=2))
        if armature:
            mass = mass + torch.diag_embed(self.armature.expand_as(q))
        return mass

    def site_position(self, q: torch.Tensor, kin: Kinematics | None = None) -> torch.Tensor:
        """World position [B, 3] of the force site (the grasp site of the robot table)."""
        if self.chain.site_body < 0:
            raise DynamicsError("this chain has no force site")
        kin = kin or self.kinematics(q)
        b = self.chain.site_body
        return kin.pos[:, b] + kin.rot[:, b] @ self.site_pos

    def site_jacobian(self, q: torch.Tensor, kin: Kinematics | None = None) -> torch.Tensor:
        """Translational Jacobian [B, 3, n] of the force site (MuJoCo's ``mj_jacSite`` jacp)."""
        kin = kin or self.kinematics(q)
        point = self.site_position(q, kin)
        s = kin.motion
        # Velocity of the point for a unit joint rate: v_O + w x p, for the joints that move the site's body.
        columns = (s[..., 3:] + torch.linalg.cross(s[..., :3], point[:, None, :].expand_as(s[..., :3])))
        return (columns * self.moves[self.chain.site_body][:, None]).transpose(1, 2)

    def passive_forces(self, qd: torch.Tensor) -> torch.Tensor:
        """Joint damping plus smooth dry friction (both oppose the motion)."""
        friction = self.frictionloss * torch.tanh(qd / self.friction_velocity) if self.friction_velocity > 0 else 0.0
        return -self.damping * qd - friction

    def forward_dynamics(self, q: torch.Tensor, qd: torch.Tensor, tau: torch.Tensor,
                         force: torch.Tensor | None = None) -> torch.Tensor:
        """qdd = M^-1 (tau + J^T f + passive - bias), by a batched Cholesky solve."""
        kin = self.kinematics(q)
        rhs = tau + self.passive_forces(qd) - self.bias_forces(q, qd, kin)
        if force is not None:
            rhs = rhs + (self.site_jacobian(q, kin).transpose(1, 2) @ force[:, :, None])[:, :, 0]
        chol = torch.linalg.cholesky(self.mass_matrix(q, kin))
        return torch.cholesky_solve(rhs[:, :, None], chol)[:, :, 0]

    def clip_torque(self, tau: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(tau, self.torque_limit), -self.torque_limit)

    def step(self, q: torch.Tensor, qd: torch.Tensor, tau: torch.Tensor, dt: float, substeps: int = 5,
             force: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance by ``dt``: the clipped torque (and force) held for ``substeps`` semi-implicit Euler steps."""
        tau = self.clip_torque(tau)
        h = dt / substeps
        for _ in range(substeps):
            qdd = self._substep_dynamics(q, qd, tau, force)
            qd = qd + h * qdd
            q = q + h * qd
        return q, qd
