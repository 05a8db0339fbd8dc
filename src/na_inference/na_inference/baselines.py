"""Baselines evaluated in the same harness as the network (na-eval):

* ``RidgeForce``: ridge regression from the CURRENT telemetry frame to the force (fitted on labelled frames),
  gated by a logistic regression for "holding / in contact" - the trivial baseline method.md asks for.
* ``IDLinear``: torque = k_j * load_j + b_j per joint (linear actuator model, least squares against the
  rigid-body inverse dynamics on frames without external force); the force is the inverse-dynamics
  residual tau_id - tau_motor = J^T f mapped back through the pseudo-inverse of J^T.
* ``MomentumObserver``: the generalized momentum observer (De Luca) with the same linear actuator model:
  r_k = K (p_k - p_0 - sum(tau_motor + Mdot qd - bias - passive + r) dt), r ~ J^T f.
* ``ConditionDetectors``: threshold / SVM / random forest motor-condition detectors (scikit-learn) on
  per-frame telemetry of one joint.

Every force estimator has ``fit(trajs)`` and ``predict(traj) -> (force [T, 3], contact_probability [T] or
None)``, with the prediction for row i computed from telemetry up to row i only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.signal import savgol_filter
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from .dynamics import RigidBodyDynamics
from .features import FeatureSpec
from .nad import Trajectory

CONTACT_THRESHOLD_N = 0.01


def force_targets(traj: Trajectory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(force [T, 3] with unlabelled axes of labelled frames = 0, labelled [T] bool, contact [T] bool)."""
    labelled = traj.force_labelled
    force = np.where(labelled[:, None], np.nan_to_num(traj.force), 0.0)
    contact = labelled & (np.linalg.norm(force, axis=1) > CONTACT_THRESHOLD_N)
    return force, labelled, contact


class RidgeForce:
    """Ridge regression on the current telemetry frame for the force, logistic regression for the gate."""

    name = "ridge"

    def __init__(self, spec: FeatureSpec, alpha: float = 1.0) -> None:
        self.spec = spec
        self.force_model = make_pipeline(StandardScaler(), Ridge(alpha=alpha))
        self.gate_model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))

    def fit(self, trajs: list[Trajectory]) -> RidgeForce:
        x = np.concatenate([self.spec.frames(t) for t in trajs])
        targets = [force_targets(t) for t in trajs]
        force = np.concatenate([f for f, _, _ in targets])
        labelled = np.concatenate([lab for _, lab, _ in targets])
        contact = np.concatenate([c for _, _, c in targets])
        self.force_model.fit(x[labelled], force[labelled])
        self.has_gate = len(np.unique(contact)) > 1
        if self.has_gate:
            self.gate_model.fit(x, contact)
        return self

    def predict(self, traj: Trajectory) -> tuple[np.ndarray, np.ndarray | None]:
        x = self.spec.frames(traj)
        force = self.force_model.predict(x)
        gate = self.gate_model.predict_proba(x)[:, 1] if self.has_gate else np.ones(len(x))
        return force * gate[:, None], gate


@dataclass
class MotionEstimate:
    """Smoothed joint motion of a recorded trajectory (Savitzky-Golay derivatives)."""

    q: np.ndarray
    qd: np.ndarray
    qdd: np.ndarray


def estimate_motion(traj: Trajectory, dt: float, window: int = 9) -> MotionEstimate:
    q = np.asarray(traj.quantities["position"], dtype=np.float64)
    window = min(window, len(q) - (1 - len(q) % 2))
    qd = savgol_filter(q, window, 2, deriv=1, delta=dt, axis=0)
    qdd = savgol_filter(q, window, 2, deriv=2, delta=dt, axis=0)
    return MotionEstimate(q, qd, qdd)


class IDLinear:
    """Linear actuator model + rigid-body inverse dynamics; force from the residual through pinv(J^T)."""

    name = "id_linear"

    def __init__(self, robot: str, dt: float, force_joints: int | None = None) -> None:
        self.dyn = RigidBodyDynamics.for_robot(robot, dtype=torch.float64)
        self.dt = dt
        # The grasp site is not moved by the gripper joint: solve with the arm joints only.
        self.force_joints = force_joints or self.dyn.n - 1
        self.gain = np.ones(self.dyn.n)
        self.offset = np.zeros(self.dyn.n)

    @torch.no_grad()
    def inverse_dynamics(self, traj: Trajectory) -> tuple[np.ndarray, np.ndarray]:
        """(tau_id [T, n] = M qdd + bias + damping + friction, site Jacobian [T, 3, n])."""
        motion = estimate_motion(traj, self.dt)
        q, qd, qdd = (torch.from_numpy(a) for a in (motion.q, motion.qd, motion.qdd))
        kin = self.dyn.kinematics(q)
        tau = self.dyn.rnea(q, qd, qdd, kin) + self.dyn.armature * qdd - self.dyn.passive_forces(qd)
        return tau.numpy(), self.dyn.site_jacobian(q, kin).numpy()

    def actuator_torque(self, traj: Trajectory) -> np.ndarray:
        return self.gain * np.asarray(traj.quantities["load"]) + self.offset

    def fit(self, trajs: list[Trajectory]) -> IDLinear:
        """Least squares tau_id_j = k_j load_j + b_j on frames without external force (no contact label)."""
        loads, taus = [], []
        for t in trajs:
            _, _, contact = force_targets(t)
            free = ~contact
            if not free.any():
                continue
            tau, _ = self.inverse_dynamics(t)
            loads.append(np.asarray(t.quantities["load"])[free])
            taus.append(tau[free])
        if not loads:
            raise ValueError("ID-Linear needs frames without external force to fit the actuator model")
        load, tau = np.concatenate(loads), np.concatenate(taus)
        for j in range(self.dyn.n):
            a = np.stack([load[:, j], np.ones(len(load))], 1)
            (self.gain[j], self.offset[j]), *_ = np.linalg.lstsq(a, tau[:, j], rcond=None)
        return self

    def external_torque_to_force(self, tau_ext: np.ndarray, jac: np.ndarray) -> np.ndarray:
        """f = pinv(J^T) tau_ext over the arm joints, per frame."""
        k = self.force_joints
        jt = np.transpose(jac[:, :, :k], (0, 2, 1))          # [T, k, 3]
        return np.einsum("tij,tj->ti", np.linalg.pinv(jt), tau_ext[:, :k])

    def predict(self, traj: Trajectory) -> tuple[np.ndarray, None]:
        tau_id, jac = self.inverse_dynamics(traj)
        return self.external_torque_to_force(tau_id - self.actuator_torque(traj), jac), None


@dataclass
class MomentumObserver:
    """Generalized momentum observer on the linear actuator model of a fitted ``IDLinear``."""

    model: IDLinear
    gain: float = 20.0  # 1/s, observer bandwidth
    name: str = field(default="momentum_observer", init=False)

    def fit(self, trajs: list[Trajectory]) -> MomentumObserver:
        self.model.fit(trajs)
        return self

    @torch.no_grad()
    def predict(self, traj: Trajectory) -> tuple[np.ndarray, None]:
        dyn, dt = self.model.dyn, self.model.dt
        # Causal velocity (backward difference): the observer runs online.
        q_np = np.asarray(traj.quantities["position"], dtype=np.float64)
        qd_np = np.vstack([np.zeros((1, q_np.shape[1])), np.diff(q_np, axis=0) / dt])
        q, qd = torch.from_numpy(q_np), torch.from_numpy(qd_np)
        kin = dyn.kinematics(q)
        mass = dyn.mass_matrix(q, kin).numpy()
        bias = dyn.bias_forces(q, qd, kin).numpy()
        passive = dyn.passive_forces(qd).numpy()
        jac = dyn.site_jacobian(q, kin).numpy()
        tau_m = self.model.actuator_torque(traj)
        p = np.einsum("tij,tj->ti", mass, qd_np)
        mdot_qd = np.vstack([np.zeros((1, q_np.shape[1])),
                             np.einsum("tij,tj->ti", np.diff(mass, axis=0) / dt, qd_np[1:])])
        r = np.zeros_like(p)
        integral = np.zeros(p.shape[1])
        for k in range(1, len(p)):
            integral += (tau_m[k - 1] + mdot_qd[k - 1] - bias[k - 1] + passive[k - 1] + r[k - 1]) * dt
            r[k] = self.gain * (p[k] - p[0] - integral)
        return self.model.external_torque_to_force(r, jac), None


class ConditionDetectors:
    """Per-frame motor-condition classifiers for one joint: threshold on |load|, an RBF SVM and a random
    forest on (load, current, position error, velocity) of that joint. Label 1 = normal, 0 = degraded."""

    QUANTITIES = ("load", "current", "velocity")

    def __init__(self, joint: int, seed: int = 0) -> None:
        self.joint = joint
        self.svm = make_pipeline(StandardScaler(), SVC(random_state=seed))
        self.forest = RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=1)
        self.threshold = 0.0
        self.normal_above = False

    def features(self, traj: Trajectory) -> np.ndarray:
        j = self.joint
        cols = [np.abs(np.asarray(traj.quantities[name])[:, j]) for name in self.QUANTITIES if name in traj.quantities]
        err = np.asarray(traj.quantities["goal_position"])[:, j] - np.asarray(traj.quantities["position"])[:, j]
        return np.stack([*cols, np.abs(err)], 1)

    def fit(self, trajs: list[Trajectory], labels: list[float]) -> ConditionDetectors:
        x = np.concatenate([self.features(t) for t in trajs])
        y = np.concatenate([np.full(len(t), lab) for t, lab in zip(trajs, labels)])
        if len(np.unique(y)) < 2:
            raise ValueError("condition detectors need normal and degraded trajectories")
        # Threshold on the first feature (|load| or |current|): best split by accuracy over candidate cuts.
        best = -1.0
        for cut in np.quantile(x[:, 0], np.linspace(0.02, 0.98, 49)):
            for above in (False, True):
                acc = float(np.mean(((x[:, 0] > cut) == above) == (y == 1)))
                if acc > best:
                    best, self.threshold, self.normal_above = acc, float(cut), above
        self.svm.fit(x[:: max(1, len(x) // 3000)], y[:: max(1, len(x) // 3000)])
        self.forest.fit(x, y)
        return self

    def predict(self, traj: Trajectory) -> dict[str, np.ndarray]:
        """Per-frame probability of "normal" for each detector."""
        x = self.features(traj)
        return {
            "threshold": ((x[:, 0] > self.threshold) == self.normal_above).astype(float),
            "svm": 1.0 / (1.0 + np.exp(-self.svm.decision_function(x))),  # margin -> (0, 1), 0.5 at the boundary
            "random_forest": self.forest.predict_proba(x)[:, 1],
        }
