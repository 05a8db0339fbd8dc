"""Scenarios carry the right truths; synthetic episodes are exact NAD files, deterministic per seed."""

import numpy as np
import pytest

from na_description.robot_table import load_robot
from na_inference.nad import find_trajectories, load_trajectory
from na_sim.dataset import episode_text, generate, simulate_episode
from na_sim.scenarios import SCENARIOS, make_scenario

GRAVITY = 9.81


def test_every_scenario_builds_for_every_robot_within_the_joint_limits():
    for robot in ("so101", "omx", "panda"):
        table = load_robot(robot)
        for name in SCENARIOS:
            scenario = make_scenario(name, robot, 7)
            for t in np.linspace(0.0, scenario.duration, 50):
                goal = scenario.goal(float(t))
                assert goal.shape == (table.n_joints,)
                assert np.all(goal >= np.array(table.position_min) - 1e-9)
                assert np.all(goal <= np.array(table.position_max) + 1e-9)
    with pytest.raises(ValueError, match="unknown scenario"):
        make_scenario("juggle", "so101")


def test_pick_and_place_labels_the_payload_weight_while_it_is_held():
    scenario = make_scenario("pick_and_place", "so101", 3)
    episode = simulate_episode("so101", scenario, seed=3)
    attach, detach = (e.time for e in scenario.events if e.kind == "payload")
    t = episode.trajectory.time
    held = (t > attach + 0.02) & (t < detach)
    free = (t < attach) | (t > detach + 0.02)
    weight = -scenario.payload_kg * GRAVITY
    np.testing.assert_allclose(episode.truth_force[held], np.tile([0, 0, weight], (held.sum(), 1)))
    assert np.all(episode.truth_contact[held] == 1) and np.all(episode.truth_contact[free] == 0)
    # NAD convention: only z is labelled for a payload; -999 (NaN) elsewhere and when nothing is held.
    force = episode.trajectory.force
    assert np.all(np.isnan(force[held, :2])) and np.allclose(force[held, 2], weight)
    assert np.all(np.isnan(force[free]))
    # Holding the payload loads the shoulder/elbow more than the same motion without it would.
    load = np.abs(episode.trajectory.quantities["load"][:, 1:3]).mean(axis=1)
    assert load[held].mean() > load[free].mean()
    # The object stops the jaws from the reach to the release: the gripper servo stalls on it while held.
    grasp = [e for e in scenario.events if e.kind == "grasp"]
    assert [e.value is None for e in grasp] == [False, True] and grasp[1].time == detach
    gripper = load_robot("so101").joint_index("gripper")
    q = episode.trajectory.quantities
    carried = held & (t < detach - 0.6)  # the last 0.6 s before the release opens the gripper
    assert carried.sum() > 50
    assert np.all(q["goal_position"][carried, gripper] < q["position"][carried, gripper] - np.radians(3))
    assert np.all(q["load"][carried, gripper] > 0.1)
    assert not [e for e in make_scenario("pick_and_place", "omx", 3).events if e.kind == "grasp"]  # no object set


def test_push_scenario_truth_is_the_scheduled_force():
    scenario = make_scenario("push", "so101", 5, duration=6.0)
    episode = simulate_episode("so101", scenario, seed=5)
    pushes = [e for e in scenario.events if e.kind == "push"]
    start, stop = pushes[0].time, pushes[1].time
    t = episode.trajectory.time
    during = (t > start + 0.002) & (t <= stop)
    np.testing.assert_allclose(episode.truth_force[during], np.tile(pushes[0].value, (during.sum(), 1)))
    # All three axes are labelled for a push (the true world-frame force, 2 decimals in the file).
    np.testing.assert_allclose(episode.trajectory.force[during], episode.truth_force[during])


def test_contact_scenario_presses_on_the_surface_with_an_upward_force():
    episode = simulate_episode("omx", make_scenario("contact", "omx", 2), seed=2)
    pressing = episode.truth_contact == 1
    assert pressing.mean() > 0.2
    assert np.median(episode.truth_force[pressing, 2]) > 0.5       # the surface pushes up


def test_restricted_scenario_labels_the_condition_of_one_joint():
    scenario = make_scenario("restricted", "omx", 4, duration=5.0)
    episode = simulate_episode("omx", scenario, seed=4)
    expected = np.ones(5)
    expected[scenario.restricted_joint] = 0
    assert np.all(episode.truth_condition == expected)
    np.testing.assert_array_equal(episode.trajectory.condition, expected)


def test_episodes_are_exact_nad_files_and_deterministic_per_seed(tmp_path):
    a = generate("so101", 2, seed=11, out=tmp_path / "a", scenarios=("push", "idle"), duration=3.0,
                 progress=False)
    b = generate("so101", 2, seed=11, out=tmp_path / "b", scenarios=("push", "idle"), duration=3.0,
                 progress=False)
    c = generate("so101", 1, seed=12, out=tmp_path / "c", scenarios=("push",), duration=3.0,
                 progress=False)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[0].read_bytes() != c[0].read_bytes()
    assert find_trajectories(tmp_path / "a", "so101") == sorted(a)
    header = a[0].read_bytes().split(b"\r\n")[0]
    assert header.startswith(b"timestamp,pos1,") and b"true_torque1" in header and b"true_contact" in header
    traj = load_trajectory(a[0])
    assert traj.robot == "so101" and traj.task == "push" and len(traj) == int(3.0 / 0.01605)
    # Register units on disk: integer counts, load in steps of 4, velocity in steps of 50 steps/s.
    columns = header.decode().split(",")
    rows = np.array([line.split(",") for line in a[0].read_text().splitlines()[1:]], dtype=float)
    load = rows[:, [columns.index(f"load{j}") for j in range(1, 7)]]
    vel = rows[:, [columns.index(f"vel{j}") for j in range(1, 7)]]
    assert np.all(load % 4 == 0) and np.all(vel % 50 == 0)
    assert traj.quantities["voltage"].min() > 10 and traj.quantities["temperature"].min() >= 20


def test_omx_episode_text_round_trips_through_the_nad_reader(tmp_path):
    episode = simulate_episode("omx", make_scenario("push", "omx", 1, duration=4.0), seed=1)
    path = tmp_path / "force_sensor" / "push" / "train" / "000.csv"
    path.parent.mkdir(parents=True)
    path.write_text(episode_text(episode), newline="")
    traj = load_trajectory(path)
    assert traj.robot == "omx"
    np.testing.assert_allclose(traj.quantities["position"], episode.trajectory.quantities["position"], atol=1e-12)
    np.testing.assert_allclose(traj.quantities["load"], episode.trajectory.quantities["load"], atol=1e-9)


def test_panda_datasets_are_refused_with_a_reason(tmp_path):
    with pytest.raises(ValueError, match="supports so101, omx"):
        generate("panda", 1, 0, tmp_path)
