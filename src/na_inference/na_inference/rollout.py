"""Closed-loop rollouts of the network through the differentiable simulator (training and the published
evaluation protocol share this code, so they cannot drift apart).

At every step the network input mixes RECORDED telemetry (goal, load, voltage, temperature, ...) with the
SIMULATED state: the position, velocity and position-error columns of the frame are overwritten with the
simulator's q, qd (rad/s, the same unit as the telemetry velocity after ``nad.py``'s conversion) and
goal - q. The history starts as recorded frames (training windows) or as the training-mean frame (the
protocol's "zero history", zero after normalization). The window ending at row i yields the torque held
over the step i -> i+1 and the force compared with the label of row i+1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .dynamics import RigidBodyDynamics
from .features import CLIP, FeatureSpec
from .model import NeuralActuatorNet
from .nad import Trajectory, load_trajectory

SIMULATED_QUANTITIES = ("position", "velocity", "position_error")
GATE_THRESHOLD_N = 0.01  # a frame is "in contact" when |f| exceeds this (method.md)


@dataclass
class PreparedTrajectory:
    """One trajectory as float32 arrays ready for windows and rollouts (physical units)."""

    name: str
    task: str
    frames: np.ndarray       # [T, F] recorded features (spec.frames)
    position: np.ndarray     # [T, J] rad
    velocity: np.ndarray     # [T, J] rad/s
    force: np.ndarray        # [T, 3] N, NaN where unlabelled
    condition: np.ndarray | None  # [J] 1 normal / 0 degraded, or None

    def __len__(self) -> int:
        return len(self.position)

    @property
    def force_mask(self) -> np.ndarray:
        """[T, 3] True where the force axis is labelled."""
        return ~np.isnan(self.force)

    @property
    def contact(self) -> np.ndarray:
        """[T] gate label: |f| > 0.01 N over the labelled axes (unlabelled frames: no contact)."""
        return (np.linalg.norm(np.nan_to_num(self.force), axis=1) > GATE_THRESHOLD_N).astype(np.float32)


def prepare(traj: Trajectory, spec: FeatureSpec) -> PreparedTrajectory:
    name = "/".join(traj.path.parts[-4:]) if traj.path is not None else traj.task
    return PreparedTrajectory(
        name=name, task=traj.task,
        frames=spec.frames(traj),
        position=np.asarray(traj.quantities["position"], dtype=np.float32),
        velocity=np.asarray(traj.quantities["velocity"], dtype=np.float32),
        force=np.asarray(traj.force, dtype=np.float32),
        condition=None if traj.condition is None else np.asarray(traj.condition, dtype=np.float32),
    )


def load_prepared(paths: list[Path], spec: FeatureSpec, robot: str) -> list[PreparedTrajectory]:
    return [prepare(load_trajectory(p, robot), spec) for p in paths]


class FeatureMixer:
    """Normalization and the simulated-state columns of a spec, as torch index tensors."""

    def __init__(self, spec: FeatureSpec, dtype: torch.dtype = torch.float32) -> None:
        self.spec = spec
        self.mean = torch.tensor(spec.mean, dtype=dtype)
        self.std = torch.tensor(spec.std, dtype=dtype)

        self.position = self.columns("position")
        self.velocity = self.columns("velocity")
        self.error = self.columns("position_error")
        self.goal = self.columns("goal_position")
        if self.error is not None and self.goal is None:
            raise ValueError("position_error needs goal_position among the features")
        keep = torch.ones(spec.n_features, dtype=dtype)
        for idx in (self.position, self.velocity, self.error):
            if idx is not None:
                keep[idx] = 0.0
        self.keep = keep

    def columns(self, quantity: str) -> torch.Tensor | None:
        """Feature indices of a per-joint quantity (None when the spec does not use it)."""
        if quantity not in self.spec.quantities:
            return None
        names = self.spec.feature_names
        return torch.tensor([names.index(f"{quantity}/{j}") for j in self.spec.joint_names])

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / std clipped to +-10: the same arithmetic as FeatureSpec.normalize and the ONNX graph."""
        return torch.clamp((x - self.mean) / self.std, -CLIP, CLIP)

    def mix(self, recorded: torch.Tensor, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
        """Recorded frame [B, F] with position/velocity/position_error replaced by the simulated state."""
        frame = recorded * self.keep
        zeros = torch.zeros_like(frame)
        if self.position is not None:
            frame = frame + zeros.index_copy(1, self.position, q)
        if self.velocity is not None:
            frame = frame + zeros.index_copy(1, self.velocity, qd)
        if self.error is not None:
            frame = frame + zeros.index_copy(1, self.error, recorded[:, self.goal] - q)
        return frame


@dataclass
class RolloutOutput:
    q: torch.Tensor            # [B, T, J] simulated position after each step
    qd: torch.Tensor           # [B, T, J]
    torque: torch.Tensor       # [B, T, J] (before clipping)
    force_raw: torch.Tensor    # [B, T, 3]
    gate_logit: torch.Tensor   # [B, T, 1]
    condition_logit: torch.Tensor  # [B, T, J]

    @property
    def force(self) -> torch.Tensor:
        """Gated force g * f_raw (what the model publishes)."""
        return torch.sigmoid(self.gate_logit) * self.force_raw


def rollout(net: NeuralActuatorNet, dyn: RigidBodyDynamics, mixer: FeatureMixer, recorded: torch.Tensor,
            history: torch.Tensor, q0: torch.Tensor, qd0: torch.Tensor, dt: float, substeps: int = 5,
            apply_force: bool = False, detach_force: bool = True) -> RolloutOutput:
    """Roll ``recorded.shape[1]`` steps: recorded [B, T, F] rows s..s+T-1, history [B, H, F] the frames
    before row s (physical units), q0/qd0 [B, J] the simulator state at row s. With ``apply_force`` the gated
    force estimate acts at the grasp site (J^T f); ``detach_force`` keeps the position loss out of the force head."""
    q, qd = q0, qd0
    window = history
    outs: dict[str, list[torch.Tensor]] = {k: [] for k in ("q", "qd", "torque", "force_raw", "gate_logit",
                                                           "condition_logit")}
    for t in range(recorded.shape[1]):
        frame = mixer.mix(recorded[:, t], q, qd)
        full = torch.cat([window, frame[:, None]], 1)
        pred = net(mixer.normalize(full))
        force = torch.sigmoid(pred["gate_logit"]) * pred["force_raw"] if apply_force else None
        if force is not None and detach_force:
            force = force.detach()
        q, qd = dyn.step(q, qd, pred["torque"], dt, substeps, force)
        window = full[:, 1:]
        for key in ("torque", "force_raw", "gate_logit", "condition_logit"):
            outs[key].append(pred[key])
        outs["q"].append(q)
        outs["qd"].append(qd)
    return RolloutOutput(**{k: torch.stack(v, 1) for k, v in outs.items()})


@torch.no_grad()
def protocol_rollouts(net: NeuralActuatorNet, dyn: RigidBodyDynamics, mixer: FeatureMixer,
                      trajs: list[PreparedTrajectory], dt: float, substeps: int = 5,
                      apply_force: bool = False) -> list[RolloutOutput]:
    """The published protocol: one open-loop rollout per trajectory from row 0, qvel 0, mean-frame (zero)
    history, no noise (the caller puts the network in eval mode); T-1 steps, step i compared with row i+1.

    The trajectories run as one batch (shorter ones padded by repeating their last row; rows are independent
    across the batch, so padding never reaches another trajectory), then each output is cut to its length.
    """
    spec = mixer.spec
    longest = max(len(tr) for tr in trajs) - 1
    recorded = torch.from_numpy(np.stack([
        np.concatenate([tr.frames[:-1], np.repeat(tr.frames[-2:-1], longest - len(tr) + 1, axis=0)])
        for tr in trajs]))
    history = mixer.mean.expand(len(trajs), spec.history, spec.n_features)
    q0 = torch.from_numpy(np.stack([tr.position[0] for tr in trajs]))
    out = rollout(net, dyn, mixer, recorded, history, q0, torch.zeros_like(q0), dt, substeps, apply_force)
    return [RolloutOutput(*(getattr(out, f)[k:k + 1, :len(tr) - 1] for f in
                            ("q", "qd", "torque", "force_raw", "gate_logit", "condition_logit")))
            for k, tr in enumerate(trajs)]


def prefix_mae(abs_err: np.ndarray, prefixes: tuple[int, ...] = (100, 300, 500)) -> dict[str, float]:
    """MAE over the first N rows (all trailing axes averaged) for each prefix and the full length."""
    out = {f"first_{n}": float(abs_err[:n].mean()) for n in prefixes if n <= len(abs_err)}
    out["full"] = float(abs_err.mean())
    return out
