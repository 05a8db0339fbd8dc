"""Payload observer: the weight of an object the gripper carries, from the physics of the arm's motion.

Why: a held servo's load can sit anywhere in its gearbox's static-friction band, so the hold alone does
not fix a payload's mass, and a network trained on a dozen trials learns each trial's hold loads
(cross-validated it is level with a ridge regression; see models/so101.md). While a joint moves,
friction has a known sign, and the servo load follows

    load_j = c0 + c1 * g_j(q) + c2 * m * u_j(q) + c3 * sign(qd_j) + c4 * qd_j

with g_j the arm's own holding torque and u_j the torque that 1 kg at the end effector applies (numpy
``GravityModel``). The coefficients are fitted once per robot on real recordings with known payloads
(``python -m na_inference.payload --nad-dir ../shared/nad``) and live in the robot table.

At run time, per telemetry sample:
* **carrying** starts when the gripper is stalled closed on something (commanded further closed than it
  is by ``min_error_deg`` with at least ``min_load`` effort) and the arm has then moved ``lift_angle_deg``
  (the object has left the table), or when the stream starts with the gripper already closed on
  something; it ends when the gripper lets go;
* while carrying, the mass is the least-squares solution of the load model over the moving frames of
  this carry so far (time-weighted), starting from a prior (the network's estimate) that weighs as much
  as ``prior_seconds`` of motion.

numpy only: the runtime imports neither torch nor MuJoCo.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from na_description.robot_table import RobotTable, load_robot

from .kinematics import GravityModel

GRAVITY = GravityModel.GRAVITY
#: the longest sample gap that counts as motion time (a longer gap weighs as this much)
MAX_STEP_S = 0.1


class PayloadObserverError(ValueError):
    """The robot table's payload_observer section is incomplete or inconsistent."""


@dataclass(frozen=True)
class PayloadObserverConfig:
    """The robot table's ``payload_observer`` section, resolved to joint indices and radians."""

    joints: tuple[int, ...]              # joints whose load the payload changes (the fitted ones)
    coefficients: np.ndarray             # [len(joints), 5]: c0, c1 (arm gravity), c2 (per kg), c3 (sign), c4 (qd)
    slope_scale: float                   # mean squared c2 * u_j over the fitting data: the prior's unit
    gripper: int
    closing_sign: float                  # sign of the gripper's position change when it closes
    grasp_min_error: float               # rad
    grasp_min_load: float                # duty, in the closing direction
    lift_joints: tuple[int, ...]
    lift_angle: float                    # rad
    moving_velocity: float               # rad/s
    prior_seconds: float
    first_step_s: float                  # what the first sample of a stream weighs: one telemetry period

    @classmethod
    def from_robot(cls, robot: RobotTable) -> PayloadObserverConfig | None:
        """The robot's observer, or None when its table has no ``payload_observer`` section."""
        section = robot.raw.get("payload_observer")
        if not section:
            return None
        try:
            joints = tuple(robot.joint_index(name) for name in section["joints"])
            coefficients = np.asarray(section["coefficients"], dtype=np.float64)
            grasp = section["grasp"]
            config = cls(
                joints=joints, coefficients=coefficients, slope_scale=float(section["slope_scale"]),
                gripper=robot.joint_index(robot.gripper_joint), closing_sign=float(grasp["closing_sign"]),
                grasp_min_error=np.radians(float(grasp["min_error_deg"])), grasp_min_load=float(grasp["min_load"]),
                lift_joints=tuple(robot.joint_index(name) for name in section["lift_joints"]),
                lift_angle=np.radians(float(section["lift_angle_deg"])),
                moving_velocity=float(section["moving_velocity"]), prior_seconds=float(section["prior_seconds"]),
                first_step_s=float(robot.data_dt))
        except (KeyError, TypeError, ValueError) as err:
            raise PayloadObserverError(f"{robot.name}: payload_observer section: {err}") from err
        if coefficients.shape != (len(joints), 5) or not np.isfinite(coefficients).all():
            raise PayloadObserverError(f"{robot.name}: payload_observer needs 5 finite coefficients per joint, "
                                       f"got shape {coefficients.shape}")
        if config.slope_scale <= 0 or config.prior_seconds < 0 or abs(config.closing_sign) != 1:
            raise PayloadObserverError(f"{robot.name}: payload_observer needs slope_scale > 0, prior_seconds >= 0 "
                                       "and closing_sign +-1")
        return config

    def with_coefficients(self, coefficients: np.ndarray, slope_scale: float) -> PayloadObserverConfig:
        """The same observer with refitted coefficients (cross-validation fits one per fold)."""
        return PayloadObserverConfig(**{**self.__dict__, "coefficients": np.asarray(coefficients),
                                        "slope_scale": float(slope_scale)})


@dataclass
class PayloadEstimate:
    carrying: bool
    mass_kg: float                       # 0 when not carrying


@dataclass
class PayloadObserver:
    """One arm's carry detection and mass estimate; feed it every telemetry sample in time order."""

    config: PayloadObserverConfig
    gravity: GravityModel
    _grasp_pose: np.ndarray | None = field(default=None, init=False)
    _carrying: bool = field(default=False, init=False)
    _moment: float = field(default=0.0, init=False)
    _weight: float = field(default=0.0, init=False)
    _last_stamp: float | None = field(default=None, init=False)

    @classmethod
    def for_robot(cls, robot: str | RobotTable) -> PayloadObserver | None:
        table = load_robot(robot) if isinstance(robot, str) else robot
        config = PayloadObserverConfig.from_robot(table)
        return None if config is None else cls(config, GravityModel.from_robot(table))

    def refitted(self, trajs: Sequence) -> PayloadObserver:
        """A fresh observer like this one, its load model fitted on ``trajs`` (``fit_load_model``)."""
        coefficients, scale = fit_load_model(trajs, self.gravity, self.config.joints, self.config.moving_velocity)
        return PayloadObserver(self.config.with_coefficients(coefficients, scale), self.gravity)

    def reset(self) -> None:
        """Forget everything (a new stream: a gripper closed at its first sample counts as carrying)."""
        self._grasp_pose, self._carrying, self._last_stamp = None, False, None
        self._end_carry()

    def _end_carry(self) -> None:
        self._moment = self._weight = 0.0

    def grasping(self, position: np.ndarray, goal_position: np.ndarray, load: np.ndarray) -> bool:
        """The gripper is stalled closed on something: commanded further closed, pushing to close."""
        c, g = self.config, self.config.gripper
        return bool(c.closing_sign * (goal_position[g] - position[g]) > c.grasp_min_error
                    and -c.closing_sign * load[g] > c.grasp_min_load)

    def update(self, stamp: float, position: np.ndarray, goal_position: np.ndarray, velocity: np.ndarray,
               load: np.ndarray, prior_kg: float = 0.0, contact: bool | None = None) -> PayloadEstimate:
        """One sample (physical units, robot-table joint order). ``contact`` overrides the carry
        detection (evaluation with known contact timing); ``prior_kg`` is the mass to assume before
        the arm has moved."""
        c = self.config
        first = self._last_stamp is None
        step = c.first_step_s if first else min(max(stamp - self._last_stamp, 0.0), MAX_STEP_S)
        self._last_stamp = stamp
        if contact is None:
            if self.grasping(position, goal_position, load):
                if self._grasp_pose is None:
                    self._grasp_pose = np.asarray(position, dtype=np.float64).copy()
                    self._carrying = first  # already holding when the stream starts: it hangs in the gripper
                lifted = np.abs(np.asarray(position)[list(c.lift_joints)] - self._grasp_pose[list(c.lift_joints)])
                if lifted.max() > c.lift_angle:
                    self._carrying = True
            else:
                self._grasp_pose, self._carrying = None, False
            carrying = self._carrying
        else:
            carrying = bool(contact)
        if not carrying:
            self._end_carry()
            return PayloadEstimate(False, 0.0)
        moving = [(row, joint) for row, joint in enumerate(c.joints) if abs(velocity[joint]) > c.moving_velocity]
        arm, per_kg = self.gravity.torques(position) if moving else (None, None)  # 0.16 ms: only when needed
        for row, joint in moving:
            qd = float(velocity[joint])
            k = c.coefficients[row]
            slope = k[2] * per_kg[joint]
            residual = load[joint] - k[0] - k[1] * arm[joint] - k[3] * np.sign(qd) - k[4] * qd
            self._moment += slope * residual * step
            self._weight += slope * slope * step
        prior_weight = c.prior_seconds * c.slope_scale
        total = prior_weight + self._weight
        mass = (prior_weight * max(prior_kg, 0.0) + self._moment) / total if total > 0 else max(prior_kg, 0.0)
        return PayloadEstimate(True, max(mass, 0.0))


# ------------------------------------------------------------------------------------------------ fitting

def load_model_rows(traj, gravity: GravityModel, joints: Sequence[int], moving_velocity: float,
                    rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per joint: regressors [n, 5] (column 2 per kg of payload) and loads [n] of ``rows`` where it moves."""
    return _regressors(traj, *gravity.torques(traj.quantities["position"]), joints, moving_velocity, rows)


def _regressors(traj, arm: np.ndarray, per_kg: np.ndarray, joints: Sequence[int], moving_velocity: float,
                rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """``load_model_rows`` with the trajectory's gravity torques [T, n] already computed."""
    q = traj.quantities
    out = []
    for joint in joints:
        v = q["velocity"][:, joint]
        sel = rows & (np.abs(v) > moving_velocity)
        x = np.stack([np.ones(sel.sum()), arm[sel, joint], per_kg[sel, joint], np.sign(v[sel]), v[sel]], 1)
        out.append((x, q["load"][sel, joint]))
    return out


def payload_kg(traj) -> float | None:
    """A trajectory's payload mass: from its NAD path (``300g``) when it has one, else from its labelled
    frames (na-record: force_z = -m g while holding); None when neither says."""
    if traj.payload_kg is not None:
        return float(traj.payload_kg)
    labelled = traj.force_labelled
    if not labelled.any():
        return None
    return float(-np.median(traj.force[labelled, 2]) / GRAVITY)


def fit_load_model(trajs: Sequence, gravity: GravityModel, joints: Sequence[int],
                   moving_velocity: float) -> tuple[np.ndarray, float]:
    """(coefficients [len(joints), 5], slope scale) by least squares over the labelled moving frames of
    trajectories with a payload (``payload_kg``: own recordings need no NAD folder names)."""
    per_joint: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in joints]
    masses = [payload_kg(traj) for traj in trajs]
    if len({round(m, 3) for m in masses if m is not None}) < 2:
        raise PayloadObserverError("the fit needs trials with at least two different payload masses, "
                                   f"got {sorted({m for m in masses if m is not None})}")
    payload_torques = []  # [T, n] per kg, of each trajectory with a payload: the slope scale needs them too
    for traj, mass in zip(trajs, masses):
        if mass is None:
            continue
        arm, per_kg = gravity.torques(traj.quantities["position"])
        payload_torques.append(per_kg)
        for row, (x, y) in enumerate(_regressors(traj, arm, per_kg, joints, moving_velocity, traj.force_labelled)):
            x[:, 2] *= mass
            per_joint[row].append((x, y))
    coefficients = []
    for row, pairs in enumerate(per_joint):
        x = np.concatenate([p[0] for p in pairs]) if pairs else np.zeros((0, 5))
        if len(x) < 20:
            raise PayloadObserverError(f"joint {joints[row]}: {len(x)} moving labelled frames, too few to fit")
        y = np.concatenate([p[1] for p in pairs])
        c, *_ = np.linalg.lstsq(x, y, rcond=None)
        coefficients.append(c)
    slopes = [(coefficients[row][2] * per_kg[:, joint]) ** 2 for per_kg in payload_torques
              for row, joint in enumerate(joints)]
    return np.array(coefficients), float(np.mean(np.concatenate(slopes)))


def observe_trajectory(observer: PayloadObserver, traj, prior_kg: np.ndarray | None = None,
                       contact: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Run a fresh observer over a whole trajectory: (mass kg [T], carrying [T])."""
    observer.reset()
    q = traj.quantities
    mass, carrying = np.zeros(len(traj)), np.zeros(len(traj), dtype=bool)
    for i, stamp in enumerate(traj.time):
        est = observer.update(float(stamp), q["position"][i], q["goal_position"][i], q["velocity"][i], q["load"][i],
                              prior_kg=0.0 if prior_kg is None else float(prior_kg[i]),
                              contact=None if contact is None else bool(contact[i]))
        mass[i], carrying[i] = est.mass_kg, est.carrying
    return mass, carrying


def yaml_block(coefficients: np.ndarray, slope_scale: float) -> str:
    """The fitted lines of the robot table's payload_observer section."""
    rows = ",\n    ".join("[" + ", ".join(f"{v:.6g}" for v in row) + "]" for row in coefficients)
    return f"  coefficients:\n    [{rows}]\n  slope_scale: {slope_scale:.6g}"


def main(argv: list[str] | None = None) -> int:
    from .nad import find_trajectories, holdout_split, load_trajectory

    parser = argparse.ArgumentParser(
        prog="python -m na_inference.payload",
        description="Fit the payload observer's load model on the training files of NAD recordings with known "
                    "payloads, print the robot-table lines, and score the carry detection and the force.")
    parser.add_argument("--robot", default="so101")
    parser.add_argument("--nad-dir", type=Path, default=Path("../shared/nad"))
    parser.add_argument("--holdout-fold", type=int, default=-1, help="as na-train (-1: each task's last file)")
    parser.add_argument("--files", type=Path, nargs="+",
                        help="fit on these NAD CSVs instead, all of them (e.g. your own arm's na-record "
                             "recordings with --payload-kg: the mass comes from the labels)")
    args = parser.parse_args(argv)
    table_observer = PayloadObserver.for_robot(args.robot)
    if table_observer is None:
        parser.error(f"{args.robot}: the robot table has no payload_observer section")
    if args.files:
        train_paths, val_paths = list(args.files), []
    else:
        try:
            train_paths, val_paths = holdout_split(find_trajectories(args.nad_dir, args.robot),
                                                   fold=args.holdout_fold)
        except (FileNotFoundError, ValueError) as err:
            parser.error(str(err))
    train = [load_trajectory(p, args.robot) for p in train_paths]
    try:
        observer = table_observer.refitted(train)
    except PayloadObserverError as err:
        parser.error(f"cannot fit: {err} (record trials that lift a known payload: na-record --payload-kg)")
    print(f"fitted on {len(train)} files; robot-table lines:\n")
    print(yaml_block(observer.config.coefficients, observer.config.slope_scale))
    print("\n| held-out file | label (kg) | carry detection accuracy | mass while carrying (kg, mean) |")
    print("|---|---|---|---|")
    for path in val_paths:
        traj = load_trajectory(path, args.robot)
        mass, carrying = observe_trajectory(observer, traj)
        accuracy = float(np.mean(carrying == traj.force_labelled))
        held = f"{mass[carrying].mean():.3f}" if carrying.any() else "-"
        print(f"| {'/'.join(path.parts[-4:])} | {traj.payload_kg} | {accuracy:.3f} | {held} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
