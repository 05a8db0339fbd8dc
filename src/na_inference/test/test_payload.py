"""The payload observer: numpy gravity against our MuJoCo-checked torch dynamics, carry detection and mass
recovery on telemetry made with its own load model, the robot table's fitted coefficients against a
fresh fit, and the engine publishing the observer's weight on a real NAD pick-and-place."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_models import contract_model

from na_description.robot_table import load_robot
from na_inference.dynamics import RigidBodyDynamics
from na_inference.engine import InferenceEngine, SampleStatus
from na_inference.kinematics import GravityModel
from na_inference.nad import find_trajectories, holdout_split, load_trajectory
from na_inference.payload import (
    GRAVITY,
    PayloadObserver,
    PayloadObserverConfig,
    PayloadObserverError,
    fit_load_model,
    observe_trajectory,
)

TABLE = load_robot("so101")
GRAVITY_MODEL = GravityModel.from_robot(TABLE)
CONFIG = PayloadObserverConfig.from_robot(TABLE)
MASS_KG = 0.4


def test_numpy_gravity_equals_the_torch_dynamics() -> None:
    """The arm's holding torque equals bias_forces(q, 0) (same inertias: URDF and MJCF agree) and the
    per-kg torque equals -g J_z of the grasp site (the URDF's gripper frame sits 0.02 mm from it)."""
    q = np.random.default_rng(0).uniform(-1.5, 1.5, (40, 6))
    dyn = RigidBodyDynamics.for_robot("so101")
    qt = torch.tensor(q)
    arm, per_kg = GRAVITY_MODEL.torques(q)
    np.testing.assert_allclose(arm, dyn.bias_forces(qt, torch.zeros_like(qt)).numpy(), atol=1e-5)
    np.testing.assert_allclose(per_kg, -GRAVITY * dyn.site_jacobian(qt).numpy()[:, 2, :], atol=1e-4)
    one_arm, one_kg = GRAVITY_MODEL.torques(q[7])
    np.testing.assert_array_equal(one_arm, arm[7])
    np.testing.assert_array_equal(one_kg, per_kg[7])


class Telemetry:
    """What the observer reads of a trajectory, made with its own load model."""

    def __init__(self, rows: int, carried: np.ndarray, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        dt = TABLE.data_dt
        self.time = np.arange(rows) * dt
        t = self.time[:, None]
        position = 0.3 * np.sin(2 * np.pi * rng.uniform(0.2, 0.4, 6) * t + rng.uniform(0, 6, 6))
        velocity = np.gradient(position, dt, axis=0)
        gripper, closing = CONFIG.gripper, CONFIG.closing_sign
        goal = position.copy()
        goal[:, gripper] = position[:, gripper] + closing * np.where(carried, np.radians(10), 0.0)
        load = np.zeros((rows, 6))
        load[:, gripper] = np.where(carried, -closing * 0.4, 0.0)
        arm, per_kg = GRAVITY_MODEL.torques(position)
        for row, joint in enumerate(CONFIG.joints):
            c, v = CONFIG.coefficients[row], velocity[:, joint]
            load[:, joint] = (c[0] + c[1] * arm[:, joint] + c[2] * MASS_KG * carried * per_kg[:, joint]
                              + c[3] * np.sign(v) + c[4] * v)
        self.quantities = {"position": position, "goal_position": goal, "velocity": velocity, "load": load}

    def __len__(self) -> int:
        return len(self.time)


def carried_rows(rows: int, start: int, end: int) -> np.ndarray:
    carried = np.zeros(rows, dtype=bool)
    carried[start:end] = True
    return carried


def test_a_lifted_grasp_is_carried_and_its_mass_recovered() -> None:
    telemetry = Telemetry(400, carried_rows(400, 100, 300))
    observer = PayloadObserver(CONFIG, GRAVITY_MODEL)
    mass, carrying = observe_trajectory(observer, telemetry)
    assert not carrying[:100].any() and not carrying[300:].any()  # no grasp, no carry; release ends it
    started = np.flatnonzero(carrying)[0]
    assert 100 <= started < 130  # the grasp, then the lift (1 deg of shoulder or elbow motion)
    assert carrying[started:300].all()
    np.testing.assert_allclose(mass[200:300], MASS_KG, atol=0.02)  # the prior (0 kg) has been outweighed
    assert np.all(mass[~carrying] == 0)


def test_a_grasp_without_a_lift_is_not_a_carry_but_a_closed_gripper_at_start_is() -> None:
    rows = 200
    telemetry = Telemetry(rows, carried_rows(rows, 50, 150))
    still = telemetry.quantities["position"].copy()
    still[:, list(CONFIG.lift_joints)] = still[50, list(CONFIG.lift_joints)]  # the arm does not lift
    telemetry.quantities["position"] = still
    _, carrying = observe_trajectory(PayloadObserver(CONFIG, GRAVITY_MODEL), telemetry)
    assert not carrying.any()
    held_from_start = Telemetry(rows, carried_rows(rows, 0, 150))
    _, carrying = observe_trajectory(PayloadObserver(CONFIG, GRAVITY_MODEL), held_from_start)
    assert carrying[:150].all() and not carrying[150:].any()


def test_the_prior_holds_until_the_arm_moves() -> None:
    rows = 300
    telemetry = Telemetry(rows, carried_rows(rows, 100, 250))
    telemetry.quantities["velocity"][:] = 0.0  # nothing moves fast enough to enter the fit
    prior = np.full(rows, 0.25)
    mass, carrying = observe_trajectory(PayloadObserver(CONFIG, GRAVITY_MODEL), telemetry, prior_kg=prior)
    assert carrying.any()
    np.testing.assert_allclose(mass[carrying], 0.25)


def test_known_contact_overrides_the_carry_detection() -> None:
    rows = 300
    telemetry = Telemetry(rows, carried_rows(rows, 100, 250))
    contact = carried_rows(rows, 100, 250)
    mass, carrying = observe_trajectory(PayloadObserver(CONFIG, GRAVITY_MODEL), telemetry, contact=contact)
    np.testing.assert_array_equal(carrying, contact)
    np.testing.assert_allclose(mass[180:250], MASS_KG, atol=0.02)


def test_a_table_without_the_section_has_no_observer_and_a_broken_one_is_refused() -> None:
    assert PayloadObserverConfig.from_robot(load_robot("omx")) is None
    broken = dataclasses.replace(TABLE, raw={**TABLE.raw, "payload_observer": {
        **TABLE.raw["payload_observer"], "coefficients": [[0.0, 1.0]]}})
    with pytest.raises(PayloadObserverError, match="5 finite coefficients"):
        PayloadObserverConfig.from_robot(broken)
    unnamed = dataclasses.replace(TABLE, raw={**TABLE.raw, "payload_observer": {
        **TABLE.raw["payload_observer"], "joints": ["elbow"]}})
    with pytest.raises(PayloadObserverError):
        PayloadObserverConfig.from_robot(unnamed)


def test_the_robot_table_holds_a_fit_on_the_shipped_split(nad_dir: Path) -> None:
    train, _ = holdout_split(find_trajectories(nad_dir, "so101"), fold=-1)
    coefficients, scale = fit_load_model([load_trajectory(p) for p in train], GRAVITY_MODEL, CONFIG.joints,
                                         CONFIG.moving_velocity)
    np.testing.assert_allclose(CONFIG.coefficients, coefficients, rtol=1e-5, atol=1e-6)
    assert scale == pytest.approx(CONFIG.slope_scale, rel=1e-5)


def test_own_recordings_fit_with_the_mass_from_their_labels_and_one_mass_is_refused(nad_dir: Path) -> None:
    """An na-record file has no NAD folder name: its mass comes from its labels (force_z = -m g)."""
    paths = [p for p in find_trajectories(nad_dir, "so101") if "pick_and_place" in p.as_posix()]
    named = [load_trajectory(p) for p in paths]
    unnamed = [dataclasses.replace(t, payload_kg=None) for t in named]
    from_labels, _ = fit_load_model(unnamed, GRAVITY_MODEL, CONFIG.joints, CONFIG.moving_velocity)
    from_names, _ = fit_load_model(named, GRAVITY_MODEL, CONFIG.joints, CONFIG.moving_velocity)
    # NAD labels are m * 9.8 N, our gravity 9.81: the same fit within that 0.1 %
    np.testing.assert_allclose(from_labels, from_names, rtol=2e-3, atol=1e-4)
    with pytest.raises(PayloadObserverError, match="two different payload masses"):
        fit_load_model([t for t in named if t.payload_kg == 0.3], GRAVITY_MODEL, CONFIG.joints,
                       CONFIG.moving_velocity)


def test_the_engine_publishes_the_observed_weight_on_a_real_pick_and_place(nad_dir: Path) -> None:
    """A held-out pick-and-place with 300 g: while the observer sees the carry, the z force is -g m with m
    near 0.3 kg and the contact probability 1; elsewhere the engine's output is the network's."""
    path = next(p for p in find_trajectories(nad_dir, "so101") if "pick_and_place/300g" in p.as_posix()
                and p.name == "003.csv")
    traj = load_trajectory(path)
    model = contract_model("so101", seed=3)
    with_observer = InferenceEngine(model.path, "so101")
    network_only = InferenceEngine(model.path, "so101", payload_observer=False)
    assert with_observer.payload_observer_status == "on"
    assert network_only.payload_observer_status == "off (disabled)"
    carried, masses = [], []
    for i, stamp in enumerate(traj.time):
        sample = {q: traj.quantities[q][i] for q in with_observer.quantities}
        a, b = with_observer.step(float(stamp), sample), network_only.step(float(stamp), sample)
        assert a.status is b.status
        if a.status is not SampleStatus.INFERRED:
            continue
        if a.output.payload_kg is None:
            np.testing.assert_array_equal(a.output.force, b.output.force)
            assert a.output.contact_probability == b.output.contact_probability
        else:
            assert a.output.force[2] == pytest.approx(-GRAVITY * a.output.payload_kg)
            np.testing.assert_array_equal(a.output.force[:2], b.output.force[:2])
            assert a.output.contact_probability == 1.0
            carried.append(i)
            masses.append(a.output.payload_kg)
    carried = np.array(carried)
    agreement = np.isin(np.flatnonzero(traj.force_labelled), carried).mean()
    assert agreement > 0.9, f"the carry covers {agreement:.0%} of the labelled hold"
    assert abs(np.median(masses) - 0.3) < 0.08
