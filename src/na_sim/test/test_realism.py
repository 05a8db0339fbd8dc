"""Replaying real SO-101 commands through the sim stays close to the recording (real NAD data)."""

import numpy as np

from na_inference.nad import find_trajectories, load_trajectory
from na_sim.realism import arm_joints, replay, summarize


def test_replay_of_a_real_payload_file_tracks_position_and_load(nad_dir):
    path = next(p for p in find_trajectories(nad_dir, "so101", split=None) if "go_up_and_stay_still/500g" in str(p))
    traj = load_trajectory(path, "so101")
    result = replay(traj, max_frames=200)
    joints = arm_joints("so101")
    assert len(result.time) == 200
    # Bounds are ~2x what the tuned sim achieves over whole files (README): a regression detector.
    assert result.position_mae_deg()[joints].max() < 3.0, result.position_mae_deg()
    assert result.load_mae()[joints].mean() < 0.08, result.load_mae()
    # The payload was attached where the file labels force_z: holding 500 g loads shoulder_lift.
    assert np.mean(np.abs(result.simulated_load[50:, 1])) > 0.15
    report = summarize([result])
    assert report["files"] == 1 and set(report["position_mae_deg"]) >= {"shoulder_pan", "gripper"}
