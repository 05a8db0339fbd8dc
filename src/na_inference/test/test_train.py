"""na-train on one short real trajectory: the loss falls, a resumed run is bit-identical, the pieces that
feed the network during rollouts use the shared feature pipeline."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from na_inference.features import default_spec
from na_inference.model import load_checkpoint
from na_inference.rollout import FeatureMixer, PreparedTrajectory, RolloutOutput
from na_inference.train import Batch, Dataset, TrainConfig, Trainer, jitter, learning_rate, losses


def tiny_config(nad_dir, out_dir, **overrides) -> TrainConfig:
    values = dict(nad_dir=str(nad_dir), out_dir=str(out_dir), max_files=1, max_rows=160, teacher_steps=6,
                  teacher_batch=16, rollout_steps=4, rollout_batch=4, curriculum="3:0,5:2", warmup=2,
                  validate=False, checkpoint_every=0, log_every=1, lr=3e-3,
                  compile_simulator=False)  # eager: a tiny run would spend its time compiling
    values.update(overrides)
    return TrainConfig(**values)


def test_loss_decreases_on_one_short_trajectory(nad_dir, tmp_path):
    cfg = tiny_config(nad_dir, tmp_path, teacher_steps=40, rollout_steps=0, teacher_batch=32)
    trainer = Trainer(cfg)
    losses = [trainer.train_step()["total"] for _ in range(cfg.teacher_steps)]
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])


def test_resume_from_checkpoint_gives_identical_state(nad_dir, tmp_path):
    straight = Trainer(tiny_config(nad_dir, tmp_path / "a"))
    straight.run()
    first = Trainer(tiny_config(nad_dir, tmp_path / "b"))
    first.run(until=5)  # stops inside the teacher stage; last.pt holds optimizer, EMA and RNG state
    resumed = Trainer(tiny_config(nad_dir, tmp_path / "b"))
    resumed.run(resume=tmp_path / "b" / "last.pt")
    assert resumed.step == straight.step == 10
    for name, value in straight.net.state_dict().items():
        assert torch.equal(value, resumed.net.state_dict()[name]), name
    for name, value in straight.ema.state_dict().items():
        assert torch.equal(value, resumed.ema.state_dict()[name]), name
    log = (tmp_path / "b" / "train_log.csv").read_text().splitlines()
    assert len(log) == 1 + 10 and log[-1].split(",")[1] == "rollout"
    # final.pt is the EMA network, loadable by the export/eval tools.
    net, _, spec, extra = load_checkpoint(tmp_path / "b" / "final.pt")
    assert extra["training"]["steps"] == 10 and spec.robot == "so101"
    for name, value in net.state_dict().items():
        assert torch.equal(value, resumed.ema.state_dict()[name])


def test_resume_refuses_a_checkpoint_of_another_model(nad_dir, tmp_path):
    Trainer(tiny_config(nad_dir, tmp_path / "a")).run(until=1)
    other = Trainer(tiny_config(nad_dir, tmp_path / "c", preset="reference"))
    with pytest.raises(ValueError, match="another model size"):
        other.restore(tmp_path / "a" / "last.pt")


def test_resume_refuses_a_checkpoint_trained_with_other_synthetic_episodes(nad_dir, tmp_path):
    Trainer(tiny_config(nad_dir, tmp_path / "a", synthetic_dir=str(nad_dir), synthetic_fraction=0.25)).run(until=1)
    real_only = Trainer(tiny_config(nad_dir, tmp_path / "b"))
    with pytest.raises(ValueError, match="other synthetic episodes"):
        real_only.restore(tmp_path / "a" / "last.pt")


def test_rollout_inputs_mix_simulated_state_into_recorded_frames():
    spec = default_spec("so101")
    spec = replace(spec, mean=np.arange(spec.n_features) * 0.1, std=np.full(spec.n_features, 0.5))
    mixer = FeatureMixer(spec)
    recorded = torch.randn(2, spec.n_features)
    q, qd = torch.randn(2, 6), torch.randn(2, 6)
    mixed = mixer.mix(recorded, q, qd).numpy()
    names = spec.feature_names
    for k in range(2):
        sample = {quantity: recorded[k, [names.index(f"{quantity}/{j}") for j in spec.joint_names]].numpy()
                  for quantity in spec.quantities if quantity != "position_error"}
        sample["position"], sample["velocity"] = q[k].numpy(), qd[k].numpy()
        np.testing.assert_allclose(mixed[k], spec.frame(sample), atol=1e-6)  # same as the runtime's frame()
    np.testing.assert_allclose(mixer.normalize(torch.from_numpy(mixed * 50)).numpy(), spec.normalize(mixed * 50),
                               atol=1e-6)


def test_jitter_moves_load_per_joint_and_temperature_per_window():
    """--jitter-load: every window's load columns move by one offset per joint (history and future rows
    alike, as a servo held in its static-friction band would read), within the amplitude; nothing else
    moves. --jitter-temperature moves all joints together."""
    spec = default_spec("so101")
    mixer = FeatureMixer(spec)
    batch_size, history, steps = 64, spec.history, 5
    zeros = torch.zeros(batch_size, 6)

    def fresh() -> Batch:
        return Batch(history=torch.zeros(batch_size, history, spec.n_features),
                     recorded=torch.zeros(batch_size, steps, spec.n_features), q0=zeros, qd0=zeros,
                     position=torch.zeros(batch_size, steps, 6), velocity=torch.zeros(batch_size, steps, 6),
                     force=torch.zeros(batch_size, steps, 3), force_mask=torch.zeros(batch_size, steps, 3),
                     contact=torch.zeros(batch_size, steps))

    untouched = fresh()
    jitter(TrainConfig(), mixer, untouched, torch.Generator().manual_seed(0))  # the default is off
    assert not untouched.history.any() and not untouched.recorded.any()

    batch = fresh()
    jitter(TrainConfig(jitter_load=0.2), mixer, batch, torch.Generator().manual_seed(0))
    load = mixer.columns("load")
    frames = torch.cat([batch.history, batch.recorded], 1)                  # [B, H + T, F]
    shift = frames[:, :1, load]
    assert torch.equal(frames[:, :, load], shift.expand(-1, history + steps, -1))  # one offset per window
    assert shift.abs().max() <= 0.2 and shift.abs().max() > 0.15
    assert shift[:, 0].std(0).min() > 0.05                                 # every joint moves, independently
    assert not torch.equal(shift[:, 0, 0], shift[:, 0, 1])
    others = torch.ones(spec.n_features, dtype=torch.bool)
    others[load] = False
    assert not frames[:, :, others].any()

    drift = fresh()  # temperature drifts for the whole arm: one offset per window, the same on every joint
    jitter(TrainConfig(jitter_temperature=3.0), mixer, drift, torch.Generator().manual_seed(0))
    temperature = drift.recorded[:, :, mixer.columns("temperature")]
    assert torch.equal(temperature, temperature[:, :1, :1].expand_as(temperature))
    assert 2.5 < temperature.abs().max() <= 3.0


def test_label_edge_margin_leaves_the_rows_around_each_label_switch_without_targets():
    """--label-edge-margin: within the margin of a force-label switch (NAD's pick-and-place labels switch on a
    0.5 s grid) neither the force nor the gate has a target; everywhere else the targets stay, and the gate
    loss averages over the rows that keep theirs."""
    rows, on, off = 60, 20, 40
    force = np.full((rows, 3), np.nan, np.float32)
    force[on:off] = (0.0, 0.0, -4.9)  # a payload hold, rows 20-39
    traj = PreparedTrajectory(name="hold", task="pick", frames=np.zeros((rows, 4), np.float32),
                              position=np.zeros((rows, 6), np.float32), velocity=np.zeros((rows, 6), np.float32),
                              force=force, condition=None)
    exact = Dataset([traj], history=2, dt=0.016, windows=[np.zeros((rows, 3, 4), np.float32)])
    force0, mask0, contact0, gate0, _, _ = exact.targets[0]
    assert mask0[on:off].all() and not mask0[:on].any() and not mask0[off:].any()
    assert contact0[on:off].tolist() == [1.0] * (off - on) and not contact0[:on].any()
    assert gate0.all() and exact.make_batch([(0, 5)], 3).gate_mask is None  # no margin: the reference loss

    margin = Dataset([traj], history=2, dt=0.016, windows=[np.zeros((rows, 3, 4), np.float32)], edge_margin=3)
    force_t, mask, contact, gate, _, _ = margin.targets[0]
    unsure = np.zeros(rows, bool)
    unsure[on - 3:on + 3] = unsure[off - 3:off + 3] = True
    assert not mask[unsure].any() and not gate[unsure].any()
    assert gate[~unsure].all()
    np.testing.assert_array_equal(mask[~unsure], mask0[~unsure])
    np.testing.assert_array_equal(contact, contact0)   # the labels themselves are untouched, only their weight
    np.testing.assert_array_equal(force_t, force0)

    batch = margin.make_batch([(0, 15)], 10)           # targets for rows 16-25: 17-22 lie within 3 rows of row 20
    np.testing.assert_array_equal(batch.gate_mask[0].numpy(), (~unsure[16:26]).astype(np.float32))
    out = RolloutOutput(q=batch.position, qd=batch.velocity, torque=torch.zeros(1, 10, 6),
                        force_raw=torch.zeros(1, 10, 3), gate_logit=torch.full((1, 10, 1), -3.0),
                        condition_logit=torch.zeros(1, 10, 6))
    kept = ~unsure[16:26]
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        out.gate_logit[0, kept, 0], batch.contact[0, kept])
    torch.testing.assert_close(losses(TrainConfig(), out, batch)["gate"], expected)


def test_label_edge_margin_reaches_the_dataset_in_rows_and_a_negative_one_is_refused(nad_dir, tmp_path):
    trainer = Trainer(tiny_config(nad_dir, tmp_path, label_edge_margin=0.25))
    assert trainer.data.edge_margin == round(0.25 / trainer.spec.dt) == 16
    with pytest.raises(ValueError, match="label_edge_margin"):
        Trainer(tiny_config(nad_dir, tmp_path, label_edge_margin=-0.1))


def test_learning_rate_warms_up_then_decays():
    cfg = TrainConfig(teacher_steps=100, rollout_steps=100, warmup=10, lr=1e-3)
    rates = [learning_rate(cfg, s) for s in range(200)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in itertools.pairwise(rates[10:])) and rates[-1] < 0.1e-3


def test_curriculum_lengths():
    cfg = TrainConfig(curriculum="8:0,16:150,32:300")
    assert [cfg.rollout_length(s) for s in (0, 149, 150, 299, 300, 10_000)] == [8, 8, 16, 16, 32, 32]


def test_help_lists_the_options():
    out = subprocess.run([sys.executable, "-m", "na_inference.train", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    for flag in ("--teacher-steps", "--curriculum", "--resume", "--preset", "--substeps"):
        assert flag in out.stdout


def test_missing_data_is_a_clear_error(tmp_path):
    from na_inference.train import main

    assert main(["--nad-dir", str(tmp_path / "nowhere"), "--out-dir", str(tmp_path / "out")]) == 2


def test_synthetic_pool_supplies_its_share_of_every_batch():
    from na_inference.train import Dataset

    class Stub:  # only the length matters to the sampler
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

    data = Dataset.__new__(Dataset)
    data.trajs = [Stub(50)] * 3 + [Stub(80)] * 5   # 3 real, 5 synthetic
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        picks = data.sample(gen, 16, 4, extra=5, extra_fraction=0.25)
        kinds = [k >= 3 for k, _ in picks]
        assert sum(kinds) == 4
        assert all(s >= 1 and s + 4 < (80 if k >= 3 else 50) for k, s in picks)
    assert {k for k, _ in data.sample(gen, 400, 4)} == set(range(8))  # no pool given: one uniform pool


def test_synthetic_fraction_out_of_range_is_refused(nad_dir, tmp_path):
    with pytest.raises(ValueError, match="synthetic_fraction"):
        Trainer(tiny_config(nad_dir, tmp_path, synthetic_dir=str(nad_dir), synthetic_fraction=1.5))


def test_feature_quantities_and_holdout_fold_reach_the_checkpoint(nad_dir, tmp_path):
    """--quantities trains on a subset of the telemetry and --holdout-fold picks the validation files;
    final.pt carries both, so na-export and na-eval see what the run used."""
    cfg = tiny_config(nad_dir, tmp_path, teacher_steps=2, rollout_steps=0, holdout_fold=0,
                      quantities="goal_position, position,load,velocity,position_error")
    Trainer(cfg).run()
    _, config, spec, extra = load_checkpoint(tmp_path / "final.pt")
    assert spec.quantities == ("goal_position", "position", "load", "velocity", "position_error")
    assert spec.n_features == config.n_features == 5 * 6
    assert [p.rsplit("/", 1)[1] for p in extra["training_data"]["val_files"]] == ["001.csv"] * 6
    assert extra["training"]["config"]["holdout_fold"] == 0
