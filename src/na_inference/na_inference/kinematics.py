"""Forward kinematics and gravity read from the robot's URDF, in numpy (no ROS, no MuJoCo, no torch).

The inference node uses ``SerialChain`` to express the estimated force in the end-effector TF frame and
to place the force arrow there, and ``GravityModel`` for the payload observer (the arm's own gravity
torque and the torque a payload at the end effector needs). Only fixed, revolute and continuous
joints are supported.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from na_description.robot_table import RobotTable


class KinematicsError(ValueError):
    """The description cannot give the requested chain (missing link, unsupported joint)."""


def rpy_to_matrix(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """URDF fixed-axis roll/pitch/yaw: R = Rz(yaw) Ry(pitch) Rx(roll)."""
    cr, sr, cp, sp, cy, sy = np.cos(roll), np.sin(roll), np.cos(pitch), np.sin(pitch), np.cos(yaw), np.sin(yaw)
    return np.array([
        [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
        [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
        [-sp, cp * sr, cp * cr],
    ])


def matrix_to_quat(rot: np.ndarray) -> np.ndarray:
    """Unit quaternion (x, y, z, w), ROS order, of a rotation matrix (Shepperd's method, w >= 0)."""
    m = np.asarray(rot, dtype=float)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0:
        s = 2.0 * np.sqrt(trace + 1.0)
        w, x, y, z = 0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        w, x, y, z = (m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        w, x, y, z = (m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        w, x, y, z = (m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s
    quat = np.array([x, y, z, w])
    return quat if w >= 0 else -quat


_IDENTITY = np.eye(3)


def _urdf_and_ends(robot: RobotTable) -> tuple[Path, list[str], str, str]:
    """(URDF path, joint names, base link, end-effector link) of a robot table."""
    base, tip = robot.tf_frames.get("base"), robot.tf_frames.get("end_effector")
    if not base or not tip:
        raise KinematicsError(f"{robot.name}: the robot table names no tf_frames base/end_effector")
    return robot.description_path("urdf"), list(robot.joint_names), base, tip


@dataclass(frozen=True)
class _Joint:
    """One URDF joint on the chain: its fixed origin in the parent link and its moving axis."""

    name: str
    position: np.ndarray      # child origin in the parent link frame at q = 0, m
    rotation: np.ndarray      # child orientation in the parent link frame at q = 0
    joint_index: int | None   # index into the robot table's joints; None for a fixed joint
    axis: np.ndarray          # unit axis in the child (joint) frame

    @cached_property
    def cross(self) -> np.ndarray:
        """K, the cross-product matrix of the axis (Rodrigues: R = I + sin q K + (1 - cos q) K^2)."""
        x, y, z = self.axis
        return np.array([[0, -z, y], [z, 0, -x], [-y, x, 0]])

    @cached_property
    def cross_squared(self) -> np.ndarray:
        return self.cross @ self.cross


class SerialChain:
    """Pose of the end-effector link in the base link for given joint angles (robot-table order)."""

    def __init__(self, joints: list[_Joint], base: str, tip: str) -> None:
        self.joints, self.base, self.tip = joints, base, tip
        # per joint, precomputed for pose(): (origin, fixed rotation, joint index, K, K^2)
        self._steps = [(j.position, j.rotation, j.joint_index, j.cross, j.cross_squared) for j in joints]

    @classmethod
    def from_robot(cls, robot: RobotTable) -> SerialChain:
        """The chain ``tf_frames.base`` -> ``tf_frames.end_effector`` of the robot's URDF."""
        return cls.from_urdf(*_urdf_and_ends(robot))

    @classmethod
    def from_urdf(cls, path: Path, joint_names: list[str], base: str, tip: str) -> SerialChain:
        root = ET.parse(path).getroot()
        by_child = {j.find("child").get("link"): j for j in root.findall("joint")}
        links = {link.get("name") for link in root.findall("link")}
        for name in (base, tip):
            if name not in links:
                raise KinematicsError(f"{Path(path).name} has no link {name!r}")
        chain: list[ET.Element] = []
        link = tip
        while link != base:
            joint = by_child.get(link)
            if joint is None:
                raise KinematicsError(f"{Path(path).name}: link {tip!r} is not below {base!r}")
            chain.append(joint)
            link = joint.find("parent").get("link")
        return cls([cls._joint(j, joint_names, Path(path).name) for j in reversed(chain)], base, tip)

    @staticmethod
    def _joint(joint: ET.Element, joint_names: list[str], source: str) -> _Joint:
        name, kind = joint.get("name"), joint.get("type")
        origin = joint.find("origin")
        xyz = [float(v) for v in (origin.get("xyz", "0 0 0") if origin is not None else "0 0 0").split()]
        rpy = [float(v) for v in (origin.get("rpy", "0 0 0") if origin is not None else "0 0 0").split()]
        if kind == "fixed":
            return _Joint(name, np.array(xyz), rpy_to_matrix(*rpy), None, np.zeros(3))
        if kind not in ("revolute", "continuous"):
            raise KinematicsError(f"{source}: joint {name!r} of type {kind!r} is not supported")
        if name not in joint_names:
            raise KinematicsError(f"{source}: joint {name!r} on the chain is not a robot-table joint")
        axis_el = joint.find("axis")
        axis = np.array([float(v) for v in (axis_el.get("xyz") if axis_el is not None else "1 0 0").split()])
        return _Joint(name, np.array(xyz), rpy_to_matrix(*rpy), joint_names.index(name),
                      axis / np.linalg.norm(axis))

    def pose(self, joint_positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position [3] m, rotation [3, 3]) of the tip link in the base link frame."""
        rot, pos = np.eye(3), np.zeros(3)
        for origin, fixed, index, k, k2 in self._steps:
            pos = pos + rot @ origin
            rot = rot @ fixed
            if index is not None:
                angle = float(joint_positions[index])
                rot = rot @ (_IDENTITY + np.sin(angle) * k + (1.0 - np.cos(angle)) * k2)
        return pos, rot


class GravityModel:
    """Static torques of the whole URDF tree: the arm's holding torque against gravity and the torque
    that 1 kg at the end-effector link applies, per joint in robot-table order.

    Both are what our torch dynamics gives as ``bias_forces(q, 0)`` and ``-9.81 * site_jacobian(q)[:, 2]``
    (tested against it); this copy exists because the runtime imports neither torch nor MuJoCo.
    """

    GRAVITY = 9.81

    def __init__(self, joints: list[tuple[str, str, _Joint]], masses: dict[str, tuple[float, np.ndarray]],
                 base: str, tip: str, n_joints: int) -> None:
        self.joints = joints                  # (parent link, child link, joint) from the base outwards
        self.masses = masses                  # link -> (mass kg, centre of mass in the link frame)
        self.base, self.tip, self.n_joints = base, tip, n_joints
        self._below: dict[str, set[str]] = {}  # each link with every link of its subtree (itself included)
        for parent, child, _ in reversed(joints):
            self._below.setdefault(child, {child})
            self._below.setdefault(parent, {parent}).update(self._below[child])

    @classmethod
    def from_robot(cls, robot: RobotTable) -> GravityModel:
        """The whole tree of the robot's URDF, the payload at ``tf_frames.end_effector``."""
        return cls.from_urdf(*_urdf_and_ends(robot))

    @classmethod
    def from_urdf(cls, path: Path, joint_names: list[str], base: str, tip: str) -> GravityModel:
        root = ET.parse(path).getroot()
        children: dict[str, list[ET.Element]] = {}
        for joint in root.findall("joint"):
            children.setdefault(joint.find("parent").get("link"), []).append(joint)
        masses = {}
        for link in root.findall("link"):
            inertial = link.find("inertial")
            if inertial is None or inertial.find("mass") is None:
                continue
            origin = inertial.find("origin")
            com = [float(v) for v in (origin.get("xyz", "0 0 0") if origin is not None else "0 0 0").split()]
            masses[link.get("name")] = (float(inertial.find("mass").get("value")), np.array(com))
        ordered, frontier = [], [base]
        while frontier:  # breadth first, so every parent link is placed before its children
            link = frontier.pop(0)
            for joint in children.get(link, []):
                child = joint.find("child").get("link")
                ordered.append((link, child, SerialChain._joint(joint, joint_names, Path(path).name)))
                frontier.append(child)
        if tip not in {child for _, child, _ in ordered}:
            raise KinematicsError(f"{Path(path).name}: link {tip!r} is not below {base!r}")
        return cls(ordered, masses, base, tip, len(joint_names))

    def torques(self, joint_positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(arm holding torque [n] N.m, torque per kg at the end-effector link [n] N.m/kg) at one pose, or
        [B, n] each for a batch of poses [B, n] (one pose at a time: the runtime's cost is one pose)."""
        q = np.asarray(joint_positions, dtype=np.float64)
        if q.ndim == 1:
            return self._torques_one(q)
        pairs = [self._torques_one(row) for row in q]
        return np.array([a for a, _ in pairs]).reshape(len(q), self.n_joints), \
            np.array([u for _, u in pairs]).reshape(len(q), self.n_joints)

    def _torques_one(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``torques`` for one pose (scalar trigonometry: small numpy arrays are slow)."""
        rot, pos = {self.base: _IDENTITY}, {self.base: np.zeros(3)}
        axes = []
        for parent, child, joint in self.joints:
            frame = rot[parent] @ joint.rotation
            pos[child] = pos[parent] + rot[parent] @ joint.position
            if joint.joint_index is not None:
                angle = float(q[joint.joint_index])
                axes.append((joint.joint_index, child, frame @ joint.axis, pos[child]))
                frame = frame @ (_IDENTITY + math.sin(angle) * joint.cross + (1.0 - math.cos(angle)) * joint.cross_squared)
            rot[child] = frame
        mass = dict.fromkeys(rot, 0.0)
        moment = {link: np.zeros(3) for link in rot}
        for link, (m, com) in self.masses.items():
            if link in rot:
                mass[link] += m
                moment[link] = moment[link] + m * (pos[link] + rot[link] @ com)
        for parent, child, _ in reversed(self.joints):
            mass[parent] += mass[child]
            moment[parent] = moment[parent] + moment[child]
        below = self._below
        arm, per_kg = np.zeros(self.n_joints), np.zeros(self.n_joints)
        g = self.GRAVITY
        for index, child, axis, origin in axes:
            lever = moment[child] - mass[child] * origin
            arm[index] = -g * (axis[1] * lever[0] - axis[0] * lever[1])
            if self.tip in below[child]:
                lever = pos[self.tip] - origin
                per_kg[index] = g * (axis[1] * lever[0] - axis[0] * lever[1])
        return arm, per_kg
