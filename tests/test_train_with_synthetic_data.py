"""na-sim-dataset episodes mixed into na-train: the simulator writes NAD files the trainer reads as they
are, normalization stays the real arm's, and the run records which synthetic files it used."""

from __future__ import annotations

import subprocess

import numpy as np
from na_testing import NA_SIM_DATASET

from na_inference.model import load_checkpoint
from na_inference.train import TrainConfig, Trainer


def test_training_mixes_simulated_episodes_into_real_batches(nad_dir, tmp_path):
    synthetic = tmp_path / "synthetic"
    made = subprocess.run([*NA_SIM_DATASET, "--robot", "so101", "--episodes", "2", "--seed", "3",
                           "--out", str(synthetic), "--scenarios", "go_up_and_stay", "--duration", "3",
                           "--no-progress"], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    common = dict(nad_dir=str(nad_dir), max_files=1, max_rows=160, teacher_steps=4, teacher_batch=8,
                  rollout_steps=2, rollout_batch=4, curriculum="3:0", warmup=1, validate=False,
                  checkpoint_every=0, log_every=1, compile_simulator=False)
    real_only = Trainer(TrainConfig(out_dir=str(tmp_path / "real"), **common))
    mixed = Trainer(TrainConfig(out_dir=str(tmp_path / "mixed"), synthetic_dir=str(synthetic),
                                synthetic_fraction=0.5, **common))
    assert len(mixed.synthetic_paths) == 2
    assert len(mixed.data.trajs) == len(real_only.data.trajs) + 2
    # The deployed model normalizes real telemetry: the statistics must not move with the synthetic data.
    np.testing.assert_array_equal(mixed.spec.mean, real_only.spec.mean)
    np.testing.assert_array_equal(mixed.spec.std, real_only.spec.std)
    # A payload held by the simulated arm arrives as the NAD label -m g.
    forces = [np.nanmin(t.force[:, 2]) for t in mixed.data.trajs[-2:]]
    assert all(f < -2.0 for f in forces)
    final = mixed.run()
    _, _, _, extra = load_checkpoint(final)
    assert [p.split("/")[-1] for p in extra["training_data"]["synthetic_files"]] == ["000.csv", "001.csv"]
