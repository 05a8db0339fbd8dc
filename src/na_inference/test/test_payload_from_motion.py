"""The payload-from-motion benchmark's causal observer recovers a known mass from loads made with its own
load model, only from moving frames of the current contact, and forgets it after the contact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "payload_from_motion.py"
spec = importlib.util.spec_from_file_location("payload_from_motion", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

COEFFICIENTS = {1: np.array([0.02, 0.10, 0.20, 0.03, 0.01]), 2: np.array([-0.01, 0.08, 0.15, 0.02, 0.0]),
                3: np.array([0.0, 0.05, 0.05, 0.01, 0.02])}
MASS_KG = 0.4


class SyntheticTrajectory:
    """What the observer reads of a trajectory: its quantities and its length."""

    def __init__(self, velocity: np.ndarray, load: np.ndarray) -> None:
        self.quantities = {"velocity": velocity, "load": load}

    def __len__(self) -> int:
        return len(self.quantities["load"])


def synthetic(rows: int = 200, seed: int = 0):
    """Contact on rows 40-119; the arm is still until row 60, then moves; loads follow the model exactly."""
    rng = np.random.default_rng(seed)
    arm = rng.uniform(0.5, 1.5, (rows, 6))
    per_kg = rng.uniform(1.0, 3.0, (rows, 6))
    velocity = np.zeros((rows, 6))
    velocity[60:, 1:4] = rng.uniform(0.1, 0.5, (rows - 60, 3)) * rng.choice([-1, 1], (rows - 60, 3))
    contact = np.zeros(rows, dtype=bool)
    contact[40:120] = True
    load = np.zeros((rows, 6))
    for joint, c in COEFFICIENTS.items():
        v = velocity[:, joint]
        load[:, joint] = (c[0] + c[1] * arm[:, joint] + c[2] * MASS_KG * contact * per_kg[:, joint]
                          + c[3] * np.sign(v) + c[4] * v)
    return SyntheticTrajectory(velocity, load), arm, per_kg, contact


def test_the_observer_finds_the_mass_from_moving_frames_of_the_contact_only() -> None:
    traj, arm, per_kg, contact = synthetic()
    mass = bench.observe_payload(traj, arm, per_kg, COEFFICIENTS, contact)
    assert np.all(mass[:40] == 0) and np.all(mass[120:] == 0)  # outside contact
    assert np.all(mass[40:60] == 0)  # in contact, nothing has moved yet and there is no prior
    np.testing.assert_allclose(mass[60:120], MASS_KG, atol=1e-9)


def test_a_prior_holds_until_the_arm_moves_and_then_gives_way() -> None:
    traj, arm, per_kg, contact = synthetic()
    prior = np.full(len(contact), 0.1)
    mass = bench.observe_payload(traj, arm, per_kg, COEFFICIENTS, contact, prior_kg=prior, prior_weight=5.0)
    np.testing.assert_allclose(mass[40:60], 0.1)
    assert 0.1 < mass[60] < MASS_KG and abs(mass[119] - MASS_KG) < abs(mass[60] - MASS_KG)


def test_a_new_contact_starts_from_nothing_after_a_long_enough_gap() -> None:
    traj, arm, per_kg, contact = synthetic(rows=300)
    # a second contact from row 120 + RESET_AFTER on, in which the loads carry no payload
    second = np.zeros_like(contact)
    second[120 + bench.RESET_AFTER:] = True
    mass = bench.observe_payload(traj, arm, per_kg, COEFFICIENTS, contact | second)
    np.testing.assert_allclose(mass[120 + bench.RESET_AFTER:], 0.0, atol=1e-9)
    short_gap = contact.copy()
    short_gap[121:] = True  # one idle frame: the same contact goes on, its mass estimate falls only slowly
    mass = bench.observe_payload(traj, arm, per_kg, COEFFICIENTS, short_gap)
    assert mass[125] > 0.3
