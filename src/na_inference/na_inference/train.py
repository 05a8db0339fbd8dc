"""``na-train``: train the NeuralActuator network on NAD through the differentiable simulator, on a CPU.

Two stages share one optimizer and one warm-up + cosine learning-rate schedule:

1. **Teacher-forced warm start** (cheap, large batches): windows of RECORDED telemetry - exactly what the
   runtime node feeds the model - supervise the force and gate heads, and the torque head through ONE
   simulator step from the recorded state (perturbed by noise on q, mirrored in the window's position and
   position-error columns, so the torque head learns to correct errors it will make in a rollout).
2. **Rollouts** with a length curriculum: the reference method (method.md) - the network input mixes
   recorded telemetry with the simulated position/velocity/position error, the clipped torque is held for
   ``substeps`` semi-implicit Euler substeps, and the losses compare the simulated next rows with the
   recorded ones.

Losses (reference weights): 100 smooth-L1 position, 5 smooth-L1 velocity, 30 smooth-L1 gated force (contact
frames x5, -999 frames masked; on a labelled SO-101 frame the unlabelled x/y axes are 0 N, the payload
hangs straight down), 1 gate BCE (label |f| > 0.01 N), 1 condition BCE where labels exist.
AdamW, grad-norm clip 1.0, parameter EMA (used for validation and the final checkpoint), checkpoints with
optimizer/EMA/RNG state (resume continues bit-identically), tqdm progress, CSV log, seeds.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from na_description.robot_table import load_robot

from .dynamics import RigidBodyDynamics
from .features import FeatureSpec, default_spec, fit_normalization
from .model import ModelConfig, NeuralActuatorNet, count_parameters, load_checkpoint, save_checkpoint
from .nad import find_trajectories, holdout_split, load_trajectory
from .rollout import FeatureMixer, PreparedTrajectory, RolloutOutput, prepare, protocol_rollouts, rollout

CHECKPOINT_FORMAT = "na-train-1"


@dataclass
class TrainConfig:
    """Every knob of a training run (written into the checkpoint and the model metadata)."""

    robot: str = "so101"
    nad_dir: str = "../shared/nad"
    out_dir: str = "runs/so101"
    preset: str = "small"
    seed: int = 0
    threads: int = 1
    holdout_per_task: int = 1
    holdout_fold: int = -1             # which file of each task is held out (-1 last; 0, 1, ... for cross-validation)
    max_files: int = 0                 # 0 = all training files (tests use 1)
    max_rows: int = 0                  # 0 = whole trajectories (tests use a short prefix)
    teacher_steps: int = 1500
    teacher_batch: int = 256
    teacher_noise: float = 0.02        # rad on q in the teacher-forced simulator step
    rollout_steps: int = 500
    rollout_batch: int = 32
    curriculum: str = "8:0,16:150,32:300"  # rollout length : from rollout step
    init_noise: float = 0.02           # rad on the initial q of a rollout (reference 0.05)
    jitter_temperature: float = 0.0    # deg C: per-window uniform offset on temperature (breaks trial shortcuts)
    jitter_voltage: float = 0.0        # V: per-window uniform offset on voltage
    jitter_load: float = 0.0           # duty: per-window, per-joint uniform offset on load (static-friction band)
    quantities: str = ""               # comma-separated feature quantities ("" = the robot's default set)
    label_edge_margin: float = 0.0     # s around each switch of a force label without force/gate targets
    substeps: int = 5
    compile_simulator: bool = True     # torch.compile the simulator substep (~3x faster simulator; see README)
    apply_force: bool = False          # apply the predicted force at the grasp site (J^T f) in the simulator
    synthetic_dir: str = ""            # na-sim-dataset folder mixed into training (the data is read, never copied)
    synthetic_fraction: float = 0.0    # share of every batch drawn from the synthetic episodes
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup: int = 100
    ema: float = 0.999
    grad_clip: float = 1.0
    w_position: float = 100.0
    w_velocity: float = 5.0
    w_force: float = 30.0
    w_gate: float = 1.0
    w_condition: float = 1.0
    contact_weight: float = 5.0
    checkpoint_every: int = 250
    validate: bool = True
    log_every: int = 10

    @property
    def total_steps(self) -> int:
        return self.teacher_steps + self.rollout_steps

    def rollout_length(self, rollout_step: int) -> int:
        length = 1
        for item in self.curriculum.split(","):
            steps, start = (int(v) for v in item.split(":"))
            if rollout_step >= start:
                length = steps
        return length


@dataclass
class Batch:
    """Tensors for one optimisation step; ``history`` [B, H, F], ``recorded`` [B, T, F], targets [B, T, ...]."""

    history: torch.Tensor
    recorded: torch.Tensor
    q0: torch.Tensor
    qd0: torch.Tensor
    position: torch.Tensor
    velocity: torch.Tensor
    force: torch.Tensor
    force_mask: torch.Tensor
    contact: torch.Tensor
    condition: torch.Tensor | None = None
    condition_mask: torch.Tensor | None = None
    gate_mask: torch.Tensor | None = None  # [B, T]: 0 where the gate has no target (label-edge margin)


def near_label_edges(labelled: np.ndarray, margin: int) -> np.ndarray:
    """[T] bool: rows within ``margin`` rows of a switch of the force label (margin rows on each side).

    Why: NAD's SO-101 pick-and-place labels switch on a 0.5 s grid (model card, "Where it fails"), so a
    label edge may be up to 0.25 s away from the lift or set-down it marks. Training on those rows teaches
    each trial's timing, not the physics; ``--label-edge-margin 0.25`` leaves them out.
    """
    unsure = np.zeros(len(labelled), dtype=bool)
    if margin <= 0:
        return unsure
    for edge in np.flatnonzero(np.diff(labelled.astype(np.int8))) + 1:  # first row after a switch
        unsure[max(edge - margin, 0):edge + margin] = True
    return unsure


@dataclass
class Dataset:
    """Training trajectories as arrays, with the row sampler both stages use."""

    trajs: list[PreparedTrajectory]
    history: int
    dt: float
    windows: list[np.ndarray] = field(default_factory=list)  # [T, H+1, F] per trajectory (recorded)
    edge_margin: int = 0  # rows on each side of a force-label edge with uncertain targets

    def __post_init__(self) -> None:
        self.targets = []
        for tr in self.trajs:
            labelled = tr.force_mask.any(axis=1, keepdims=True)
            force = np.where(labelled, np.nan_to_num(tr.force), 0.0).astype(np.float32)
            mask = np.broadcast_to(labelled, force.shape).astype(np.float32)
            unsure = near_label_edges(labelled[:, 0], self.edge_margin)
            mask[unsure] = 0.0  # no force and no gate target where the label's timing is uncertain
            gate_mask = (~unsure).astype(np.float32)
            cond = tr.condition if tr.condition is not None else np.zeros(tr.position.shape[1], np.float32)
            self.targets.append((force, mask, tr.contact, gate_mask, cond, float(tr.condition is not None)))

    def sample(self, gen: torch.Generator, batch: int, steps: int, extra: int = 0,
               extra_fraction: float = 0.0) -> list[tuple[int, int]]:
        """``batch`` (trajectory, start row) pairs, uniform over trajectories then starts with room for
        ``steps`` steps and a previous row (for the backward-difference velocity).

        With ``extra`` > 0 the last ``extra`` trajectories (synthetic episodes) form a second pool that
        supplies round(``extra_fraction`` * batch) of the picks, so the real/synthetic ratio does not depend
        on how many episodes were generated."""
        real = len(self.trajs) - extra
        n_extra = round(extra_fraction * batch) if extra else 0
        out = []
        for i in range(batch):
            if i < n_extra:
                k = real + int(torch.randint(extra, (1,), generator=gen))
            else:
                k = int(torch.randint(real, (1,), generator=gen))
            hi = len(self.trajs[k]) - steps - 1
            out.append((k, 1 + int(torch.randint(max(hi, 1), (1,), generator=gen))))
        return out

    def make_batch(self, picks: list[tuple[int, int]], steps: int) -> Batch:
        hist, rec, q0, qd0, pos, vel, frc, fmask, contact, gmask, cond, cmask = ([] for _ in range(12))
        for k, s in picks:
            tr = self.trajs[k]
            force, mask, cont, gate_mask, condition, has_cond = self.targets[k]
            window = self.windows[k][s]          # frames s-H..s
            hist.append(window[:-1])
            rec.append(tr.frames[s:s + steps])
            q0.append(tr.position[s])
            qd0.append((tr.position[s] - tr.position[s - 1]) / self.dt)
            rows = slice(s + 1, s + steps + 1)
            pos.append(tr.position[rows])
            vel.append(tr.velocity[rows])
            frc.append(force[rows])
            fmask.append(mask[rows])
            contact.append(cont[rows])
            gmask.append(gate_mask[rows])
            cond.append(np.broadcast_to(condition, (steps, len(condition))))
            cmask.append(np.full((steps, 1), has_cond, np.float32))

        def t(items: list[np.ndarray]) -> torch.Tensor:
            return torch.from_numpy(np.stack(items).astype(np.float32))

        has_condition = any(m.any() for m in cmask)
        return Batch(t(hist), t(rec), t(q0), t(qd0), t(pos), t(vel), t(frc), t(fmask), t(contact),
                     t(cond) if has_condition else None, t(cmask) if has_condition else None,
                     t(gmask) if self.edge_margin > 0 else None)


def feature_spec(cfg: TrainConfig) -> FeatureSpec:
    """The un-normalized feature spec of a run: the robot's default quantities unless --quantities names others."""
    chosen = tuple(q.strip() for q in cfg.quantities.split(",") if q.strip())
    return default_spec(cfg.robot, quantities=chosen or None)


def load_datasets(cfg: TrainConfig) -> tuple[list[Path], list[Path]]:
    paths = find_trajectories(cfg.nad_dir, cfg.robot, split="train")
    train, val = holdout_split(paths, cfg.holdout_per_task, cfg.holdout_fold)
    if cfg.max_files:
        train = train[:cfg.max_files]
    return train, val


def synthetic_paths(cfg: TrainConfig) -> list[Path]:
    """The na-sim-dataset episodes to mix in (none unless both the folder and a fraction are given)."""
    if not cfg.synthetic_dir or cfg.synthetic_fraction <= 0:
        return []
    if not 0 < cfg.synthetic_fraction <= 1:
        raise ValueError(f"synthetic_fraction must be in (0, 1], got {cfg.synthetic_fraction}")
    return find_trajectories(cfg.synthetic_dir, cfg.robot, split="train")


def _episode_ids(files: list | int) -> list[str] | int:
    """Identities of the synthetic episodes of a run, independent of how their folder was spelled (older
    checkpoints stored only a count)."""
    if isinstance(files, int):
        return files if files else []
    return sorted("/".join(Path(f).parts[-4:]) for f in files)


def _count(files: list | int) -> int:
    return files if isinstance(files, int) else len(files)


def read_prepared(paths: list[Path], spec, robot: str, max_rows: int = 0) -> list[PreparedTrajectory]:
    out = []
    for p in paths:
        traj = prepare(load_trajectory(p, robot), spec)
        if max_rows:
            for name in ("frames", "position", "velocity", "force"):
                setattr(traj, name, getattr(traj, name)[:max_rows])
        out.append(traj)
    return out


def losses(cfg: TrainConfig, out, batch: Batch) -> dict[str, torch.Tensor]:
    """The reference losses on a rollout (or one teacher-forced step); keys are the CSV log columns."""
    terms: dict[str, torch.Tensor] = {}
    terms["position"] = F.smooth_l1_loss(out.q, batch.position)
    terms["velocity"] = F.smooth_l1_loss(out.qd, batch.velocity)
    weight = batch.force_mask * (1.0 + (cfg.contact_weight - 1.0) * batch.contact[..., None])
    per = F.smooth_l1_loss(out.force, batch.force, reduction="none")
    terms["force"] = (per * weight).sum() / weight.sum().clamp_min(1.0)
    if batch.gate_mask is None:
        terms["gate"] = F.binary_cross_entropy_with_logits(out.gate_logit[..., 0], batch.contact)
    else:
        per_g = F.binary_cross_entropy_with_logits(out.gate_logit[..., 0], batch.contact, reduction="none")
        terms["gate"] = (per_g * batch.gate_mask).sum() / batch.gate_mask.sum().clamp_min(1.0)
    if batch.condition is not None:
        per_c = F.binary_cross_entropy_with_logits(out.condition_logit, batch.condition, reduction="none")
        terms["condition"] = (per_c * batch.condition_mask).sum() / (batch.condition_mask.sum() * per_c.shape[-1])
    else:
        terms["condition"] = out.q.new_zeros(())
    terms["total"] = (cfg.w_position * terms["position"] + cfg.w_velocity * terms["velocity"]
                      + cfg.w_force * terms["force"] + cfg.w_gate * terms["gate"]
                      + cfg.w_condition * terms["condition"])
    return terms


def jitter(cfg: TrainConfig, mixer: FeatureMixer, batch: Batch, gen: torch.Generator) -> None:
    """Shift quantities of each window by random offsets (in place). Temperature and voltage drift between
    sessions (one offset per window) and would otherwise let the network recognise a trial (and its payload)
    instead of measuring it; a held servo's load sits anywhere in its static-friction band (one offset per
    window and joint)."""
    for amount, quantity, per_joint in ((cfg.jitter_temperature, "temperature", False),
                                        (cfg.jitter_voltage, "voltage", False), (cfg.jitter_load, "load", True)):
        columns = mixer.columns(quantity)
        if amount <= 0 or columns is None:
            continue
        width = len(columns) if per_joint else 1
        shift = (torch.rand(batch.recorded.shape[0], 1, width, generator=gen) * 2 - 1) * amount
        batch.history[:, :, columns] += shift
        batch.recorded[:, :, columns] += shift


def teacher_forced_step(cfg: TrainConfig, net, dyn, mixer: FeatureMixer, batch: Batch, gen: torch.Generator):
    """One simulator step from the recorded state (q perturbed), window = recorded history + mixed frame.
    With zero position and velocity weights only the heads that need no simulator are trained (no step)."""
    if cfg.w_position == 0 and cfg.w_velocity == 0:
        window = torch.cat([batch.history, batch.recorded[:, :1]], 1)
        pred = net(mixer.normalize(window))
        return RolloutOutput(q=batch.position, qd=batch.velocity, torque=pred["torque"][:, None],
                             force_raw=pred["force_raw"][:, None], gate_logit=pred["gate_logit"][:, None],
                             condition_logit=pred["condition_logit"][:, None])
    noise = torch.randn(batch.q0.shape, generator=gen) * cfg.teacher_noise
    return rollout(net, dyn, mixer, batch.recorded[:, :1], batch.history, batch.q0 + noise, batch.qd0,
                   dyn_dt(cfg), cfg.substeps, cfg.apply_force)


def dyn_dt(cfg: TrainConfig) -> float:
    return load_robot(cfg.robot).data_dt


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to 5 % over the whole run."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.total_steps - cfg.warmup))
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@torch.no_grad()
def update_ema(ema: torch.nn.Module, net: torch.nn.Module, decay: float, step: int) -> None:
    d = min(decay, (1.0 + step) / (10.0 + step))
    for e, p in zip(ema.parameters(), net.parameters()):
        e.mul_(d).add_(p.detach(), alpha=1.0 - d)


@torch.no_grad()
def validate(cfg: TrainConfig, net, dyn, mixer: FeatureMixer, trajs: list[PreparedTrajectory]) -> dict[str, float]:
    """Rollout protocol on the held-out trajectories (worst-joint MAE in deg, force MAE all frames/axes, z
    labelled) plus the same two force metrics from recorded telemetry windows (deployment mode)."""
    net.eval()
    worst, force_all, force_z, dep_all, dep_z = [], [], [], [], []

    def score(force: np.ndarray, label: np.ndarray, all_frames: list[float], z_labelled: list[float]) -> None:
        """Force MAE over all frames and 3 axes (unlabelled = 0 N) and z MAE over the labelled frames."""
        all_frames.append(float(np.abs(force - np.nan_to_num(label)).mean()))
        lab = ~np.isnan(label[:, 2])
        if lab.any():
            z_labelled.append(float(np.abs(force[lab, 2] - label[lab, 2]).mean()))

    for tr, out in zip(trajs, protocol_rollouts(net, dyn, mixer, trajs, dyn_dt(cfg), cfg.substeps, cfg.apply_force)):
        err_deg = np.degrees(np.abs(out.q[0].numpy() - tr.position[1:]))
        worst.append(float(err_deg.mean(axis=0).max()))
        score(out.force[0].numpy(), tr.force[1:], force_all, force_z)
        windows = torch.from_numpy(mixer.spec.windows(tr.frames))
        pred = net(mixer.normalize(windows))
        score((torch.sigmoid(pred["gate_logit"]) * pred["force_raw"]).numpy(), tr.force, dep_all, dep_z)
    return {"val_worst_joint_deg": float(np.mean(worst)), "val_force_mae": float(np.mean(force_all)),
            "val_force_z_labelled": float(np.mean(force_z)) if force_z else float("nan"),
            "val_deploy_force_mae": float(np.mean(dep_all)),
            "val_deploy_force_z_labelled": float(np.mean(dep_z)) if dep_z else float("nan")}


class Trainer:
    """Holds the run state (network, EMA, optimizer, RNG) so a checkpoint can restore all of it."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        if cfg.label_edge_margin < 0:
            raise ValueError(f"label_edge_margin must be >= 0 s, got {cfg.label_edge_margin}")
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.threads)
        self.train_paths, self.val_paths = load_datasets(cfg)
        self.synthetic_paths = synthetic_paths(cfg)
        base = feature_spec(cfg)
        raw = read_prepared(self.train_paths, base, cfg.robot, cfg.max_rows)
        # Normalization comes from the real arm only: the deployed model sees real telemetry.
        self.spec = fit_normalization(base, [t.frames for t in raw])
        raw += read_prepared(self.synthetic_paths, base, cfg.robot, cfg.max_rows)
        self.data = Dataset(raw, self.spec.history, self.spec.dt, [self.spec.windows(t.frames) for t in raw],
                            edge_margin=round(cfg.label_edge_margin / self.spec.dt))
        self.val = read_prepared(self.val_paths, self.spec, cfg.robot) if cfg.validate else []
        self.mixer = FeatureMixer(self.spec)
        self.dyn = RigidBodyDynamics.for_robot(cfg.robot, dtype=torch.float32)
        if cfg.compile_simulator:
            self.dyn.compile_substeps()
        self.model_config = ModelConfig.preset(cfg.preset, self.spec.n_features, self.spec.n_joints,
                                               history=self.spec.history)
        self.net = NeuralActuatorNet(self.model_config)
        self.ema = copy.deepcopy(self.net).eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step = 0
        self.elapsed = 0.0
        self.out = Path(cfg.out_dir)

    @property
    def synthetic_share(self) -> tuple[int, float]:
        return len(self.synthetic_paths), self.cfg.synthetic_fraction

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT, "step": self.step, "elapsed_s": self.elapsed,
            "train_config": asdict(self.cfg), "ema_state_dict": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
            "sampler_rng": self.gen.get_state(),
            "train_files": [str(p) for p in self.train_paths], "val_files": [str(p) for p in self.val_paths],
            "synthetic_files": [str(p) for p in self.synthetic_paths],
        }

    def save(self, path: Path) -> None:
        save_checkpoint(path, self.net, self.model_config, self.spec, self.state())

    def restore(self, path: Path) -> None:
        net, config, spec, extra = load_checkpoint(path)
        if extra.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a na-train checkpoint (no optimizer/EMA state to resume from)")
        if not np.array_equal(spec.mean, self.spec.mean) or config.to_dict() != self.model_config.to_dict():
            raise ValueError(f"{path} was trained on other data or with another model size; cannot resume")
        saved = extra.get("synthetic_files", [])
        if _episode_ids(saved) != _episode_ids(self.synthetic_paths):
            raise ValueError(f"{path} was trained with other synthetic episodes ({_count(saved)} there, "
                             f"{len(self.synthetic_paths)} now); resume with the same --synthetic-dir")
        self.net.load_state_dict(net.state_dict())
        self.ema.load_state_dict(extra["ema_state_dict"])
        self.optimizer.load_state_dict(extra["optimizer"])
        torch.set_rng_state(extra["torch_rng"])
        self.gen.set_state(extra["sampler_rng"])
        self.step = int(extra["step"])
        self.elapsed = float(extra["elapsed_s"])

    # ------------------------------------------------------------------ loop
    def train_step(self) -> dict[str, float]:
        cfg = self.cfg
        self.net.train()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(cfg, self.step)
        if self.step < cfg.teacher_steps:
            stage, steps = "teacher", 1
            picks = self.data.sample(self.gen, cfg.teacher_batch, 1, *self.synthetic_share)
            batch = self.data.make_batch(picks, 1)
            jitter(cfg, self.mixer, batch, self.gen)
            out = teacher_forced_step(cfg, self.net, self.dyn, self.mixer, batch, self.gen)
        else:
            stage, steps = "rollout", cfg.rollout_length(self.step - cfg.teacher_steps)
            picks = self.data.sample(self.gen, cfg.rollout_batch, steps, *self.synthetic_share)
            batch = self.data.make_batch(picks, steps)
            jitter(cfg, self.mixer, batch, self.gen)
            noise = torch.randn(batch.q0.shape, generator=self.gen) * cfg.init_noise
            out = rollout(self.net, self.dyn, self.mixer, batch.recorded, batch.history, batch.q0 + noise,
                          batch.qd0, self.spec.dt, cfg.substeps, cfg.apply_force)
        terms = losses(cfg, out, batch)
        self.optimizer.zero_grad(set_to_none=True)
        terms["total"].backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.grad_clip)
        self.optimizer.step()
        update_ema(self.ema, self.net, cfg.ema, self.step)
        self.step += 1
        row = {k: float(v.detach()) for k, v in terms.items()}
        row.update(step=self.step, stage=stage, rollout_length=steps, lr=self.optimizer.param_groups[0]["lr"],
                   grad_norm=float(grad_norm))
        return row

    def run(self, until: int | None = None, resume: Path | None = None) -> Path:
        """Train to ``until`` (default: the configured total); returns the final (EMA) checkpoint path."""
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        if resume is not None:
            self.restore(resume)
        until = cfg.total_steps if until is None else until
        log_path = self.out / "train_log.csv"
        columns = ["step", "stage", "rollout_length", "lr", "total", "position", "velocity", "force", "gate",
                   "condition", "grad_norm", "elapsed_s", "val_worst_joint_deg", "val_force_mae",
                   "val_force_z_labelled", "val_deploy_force_mae", "val_deploy_force_z_labelled"]
        new_log = not log_path.exists() or resume is None
        with open(log_path, "w" if new_log else "a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
            if new_log:
                writer.writeheader()
            bar = tqdm(total=until, initial=self.step, desc=f"na-train {cfg.robot}", unit="step",
                       disable=not sys.stderr.isatty() and cfg.log_every <= 0, mininterval=2.0)
            while self.step < until:
                start = time.perf_counter()
                row = self.train_step()
                self.elapsed += time.perf_counter() - start
                row["elapsed_s"] = self.elapsed
                boundary = self.step == cfg.teacher_steps or self.step == until
                if cfg.validate and self.val and boundary:
                    row.update(validate(cfg, self.ema, self.dyn, self.mixer, self.val))
                    tqdm.write(f"step {self.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()
                                                                  if k.startswith("val_")))
                if self.step % max(cfg.log_every, 1) == 0 or boundary:
                    writer.writerow(row)
                    fh.flush()
                bar.update(1)
                bar.set_postfix(stage=row["stage"], T=row["rollout_length"], loss=f"{row['total']:.3f}")
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.save(self.out / "last.pt")
            bar.close()
        self.save(self.out / "last.pt")
        return self.write_final()

    def write_final(self) -> Path:
        """final.pt: the EMA weights as the model (what na-export and na-eval load), plus the run summary."""
        metrics = validate(self.cfg, self.ema, self.dyn, self.mixer, self.val) if self.val else {}
        extra = {
            "format": "na-train-final-1",
            "training": {"steps": self.step, "elapsed_s": round(self.elapsed, 1), "threads": self.cfg.threads,
                         "preset": self.cfg.preset, "parameters": count_parameters(self.net),
                         "config": asdict(self.cfg)},
            "training_data": {"train_files": [str(p) for p in self.train_paths],
                              "val_files": [str(p) for p in self.val_paths],
                              "synthetic_files": [str(p) for p in self.synthetic_paths]},
            "metrics": metrics,
        }
        path = self.out / "final.pt"
        save_checkpoint(path, self.ema, self.model_config, self.spec, extra)
        (self.out / "final_metrics.json").write_text(json.dumps(extra, indent=2))
        return path


def benchmark(cfg: TrainConfig, repeats: int = 5) -> dict[str, float]:
    """Milliseconds per optimisation step of each ingredient on this machine (forward + backward)."""
    torch.set_num_threads(cfg.threads)
    results: dict[str, float] = {}

    def timed(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return 1e3 * (time.perf_counter() - start) / repeats

    spec = feature_spec(cfg)
    simulators = {"sim_step": RigidBodyDynamics.for_robot(cfg.robot, dtype=torch.float32)}
    if cfg.compile_simulator:
        compiled = RigidBodyDynamics.for_robot(cfg.robot, dtype=torch.float32)
        if compiled.compile_substeps():
            simulators["sim_step_compiled"] = compiled
    for name, dyn in simulators.items():
        for batch in (16, 32, 256):
            q = torch.zeros(batch, dyn.n, requires_grad=True)

            def sim_step(q: torch.Tensor = q, dyn: RigidBodyDynamics = dyn) -> None:
                a, b = dyn.step(q, q * 0, q * 0, spec.dt, cfg.substeps)
                (a.sum() + b.sum()).backward()

            if name == "sim_step_compiled" and batch == 16:
                start = time.perf_counter()
                sim_step()  # the one compilation (every batch size shares it)
                results["sim_compile_s"] = time.perf_counter() - start
            results[f"{name}_b{batch}_ms"] = timed(sim_step)
    for preset in ("small", "reference"):
        net = NeuralActuatorNet(ModelConfig.preset(preset, spec.n_features, spec.n_joints, history=spec.history))
        for batch in (32, 256):
            x = torch.randn(batch, spec.window_length, spec.n_features)
            results[f"net_{preset}_b{batch}_ms"] = timed(lambda net=net, x=x: net(x)["torque"].sum().backward())
    return results


def parse_args(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="na-train",
        description="Train the NeuralActuator network on NAD data through the differentiable simulator "
                    "(teacher-forced warm start, then rollouts with a length curriculum). Writes "
                    "OUT_DIR/{last.pt,final.pt,train_log.csv,final_metrics.json}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("--resume", type=Path, help="continue from a last.pt checkpoint of the same run")
    parser.add_argument("--until", type=int, help="stop after this many steps (default: all)")
    parser.add_argument("--bench", action="store_true",
                        help="time the simulator step and the network (forward + backward) and exit")
    args = parser.parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    if args.bench:
        for key, value in benchmark(cfg).items():
            print(f"{key:28s} {value:8.1f}")
        return 0
    try:
        trainer = Trainer(cfg)
    except (FileNotFoundError, ValueError) as exc:
        print(f"na-train: {exc}", file=sys.stderr)
        return 2
    print(f"na-train: {len(trainer.train_paths)} training / {len(trainer.val_paths)} validation trajectories, "
          f"preset {cfg.preset} ({count_parameters(trainer.net)} parameters), {cfg.total_steps} steps",
          file=sys.stderr)
    final = trainer.run(until=args.until, resume=args.resume)
    print(f"na-train: wrote {final} ({trainer.elapsed:.0f} s of training)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
