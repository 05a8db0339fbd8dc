"""The simulated arm: reported load vs gravity, payload J^T m g, pushes, contact, determinism, threads."""

import time

import mujoco
import numpy as np
import pytest

from na_description.robot_table import load_robot
from na_sim.actuator import ServoParams
from na_sim.arm import GRAVITY, SimulatedArm, measure_real_time_factor
from na_sim.bus.backend import ArmBackend

# A servo with no losses and no sensor noise: the load register must then explain the gravity
# torque exactly through the motor model (duty * V * Kt * N / R at standstill).
LOSSLESS = dict(coulomb_friction=0.0, stribeck_friction=0.0, viscous_friction=0.0, efficiency_forward=1.0,
                efficiency_backward=1.0, backlash=0.0, position_noise_counts=0.0, load_noise=0.0,
                voltage_sensor_offset=0.0)
SO101_POSE = np.array([0.1, -0.6, 0.9, 0.4, 0.0, 0.5])
OMX_POSE = np.array([0.2, 0.3, -0.2, 0.4, -0.8])


def lossless_arm(robot: str, pose: np.ndarray, seed: int = 0) -> SimulatedArm:
    params = ServoParams.from_robot(load_robot(robot), **LOSSLESS)
    return SimulatedArm(robot, seed=seed, params=params, initial_position=pose)


def torque_from_registers(arm: SimulatedArm) -> np.ndarray:
    """The joint torque implied by the load and voltage registers through the motor model, at rest."""
    states = arm.servo_states()
    bank, p = arm.bank, arm.params
    duty = np.array([s.load for s in states]) / p.load_sign
    voltage = np.array([s.voltage for s in states])
    return duty * voltage * bank.torque_constant() * bank.v["gear_ratio"] / bank.resistance()


def gravity_torque(arm: SimulatedArm) -> np.ndarray:
    data = mujoco.MjData(arm.model)
    data.qpos[:] = arm.data.qpos
    mujoco.mj_forward(arm.model, data)
    return data.qfrc_bias[arm._dofadr].copy()


def settled_average(arm: SimulatedArm, seconds: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means of (register torque, delivered torque, gravity torque) over ``seconds`` of holding:
    the quantised position loop dithers by a count, so single samples carry M*qdd."""
    samples = []
    for _ in range(round(seconds / 0.01)):
        arm.advance(0.01)
        samples.append((torque_from_registers(arm), arm.truth().joint_torque, gravity_torque(arm)))
    return tuple(np.mean([s[i] for s in samples], axis=0) for i in range(3))


def register_tolerance(arm: SimulatedArm) -> np.ndarray:
    """One load step plus one voltage step, in N.m, plus 3 % for the Kt/R drift inside the step."""
    bank, p = arm.bank, arm.params
    per_duty = p.supply_voltage * bank.torque_constant() * bank.v["gear_ratio"] / bank.resistance()
    return per_duty * (p.load_quantum + p.voltage_quantum / p.supply_voltage) + 0.03 * np.abs(gravity_torque(arm))


def test_simulated_arm_is_an_arm_backend():
    arm = SimulatedArm("so101")
    assert isinstance(arm, ArmBackend)
    states = arm.servo_states()
    assert len(states) == 6 and all(np.isfinite(s.position) for s in states)
    with pytest.raises(IndexError):
        arm.set_goal_positions({7: 0.1})


@pytest.mark.parametrize("robot,pose", [("so101", SO101_POSE), ("omx", OMX_POSE)])
def test_holding_still_the_load_register_carries_the_gravity_torque(robot, pose):
    arm = lossless_arm(robot, pose)
    arm.advance(1.0)
    registers, delivered, gravity = settled_average(arm)
    assert np.abs(arm.joint_velocities()).max() < 0.01
    assert np.abs(gravity).max() > 0.3                 # the pose really loads the joints
    assert np.all(np.abs(registers - gravity) <= register_tolerance(arm)), (registers, gravity)
    # The ground truth is the delivered torque, which balances gravity on average at rest.
    np.testing.assert_allclose(delivered, gravity, atol=5e-3)


def test_with_real_losses_the_load_stays_within_the_friction_band():
    arm = SimulatedArm("so101", initial_position=SO101_POSE)
    arm.advance(1.0)
    registers, _, gravity = settled_average(arm)
    bank = arm.bank
    band = (bank.v["coulomb_friction"] + bank.v["stribeck_friction"]
            + (1 - bank.v["efficiency_backward"]) * np.abs(registers))
    assert np.all(np.abs(registers - gravity) <= band + register_tolerance(arm)), (registers, gravity, band)


@pytest.mark.parametrize("robot,pose", [("so101", SO101_POSE), ("omx", OMX_POSE)])
def test_payload_raises_the_load_by_jacobian_transpose_m_g(robot, pose):
    mass = 0.3 if robot == "so101" else 0.1
    arm = lossless_arm(robot, pose)
    arm.advance(1.0)
    before, _, gravity_before = settled_average(arm)
    jac = np.zeros((3, arm.model.nv))
    mujoco.mj_jac(arm.model, arm.data, jac, None, arm.grasp_position(), arm._payload_body)
    expected = jac[:, arm._dofadr].T @ np.array([0.0, 0.0, mass * GRAVITY])
    arm.set_payload(mass)
    arm.advance(1.0)
    after, _, gravity_after = settled_average(arm)
    assert arm.truth().external_force == pytest.approx([0.0, 0.0, -mass * GRAVITY])
    assert arm.truth().contact
    # The arm sags a little under the new load (P loop), which changes gravity itself slightly.
    sag = gravity_after - gravity_before
    increase = after - before
    tolerance = 2 * register_tolerance(arm) + np.abs(sag) + 0.02 * np.abs(expected)
    assert np.abs(expected).max() > 0.2
    assert np.all(np.abs(increase - expected) <= tolerance), (increase, expected)
    arm.set_payload(0.0)
    arm.advance(1.0)
    assert not arm.truth().contact


def test_a_held_object_stops_the_jaws_and_the_gripper_servo_stalls_on_it():
    """Commanded past the object, the gripper stops at it (within the object's give) and pushes to close, as
    on the real SO-101 (NAD holds: 15 deg, 0.2-0.5 duty); without the object it reaches its command."""
    arm = SimulatedArm("so101", seed=0, initial_position=SO101_POSE)
    gripper = arm.robot.joint_index(arm.robot.gripper_joint)
    closing = -1.0
    goal = SO101_POSE.copy()
    goal[gripper] = 0.05
    arm.set_grasp(0.27, closing)
    arm.set_goal_vector(goal)
    arm.advance(1.5)
    state = arm.servo_states()[gripper]
    assert 0.27 - np.radians(3) < state.position < 0.27 + np.radians(1)
    assert -closing * state.load > 0.2  # pushing towards closed
    assert arm.truth().external_force == pytest.approx([0.0, 0.0, 0.0])  # a squeeze is not an external force
    arm.set_grasp(None)
    arm.advance(1.5)
    state = arm.servo_states()[gripper]
    assert abs(state.position - 0.05) < np.radians(2) and abs(state.load) < 0.2


def test_push_truth_and_its_joint_torque():
    arm = lossless_arm("so101", SO101_POSE)
    arm.advance(1.0)
    _, before, _ = settled_average(arm)
    jac = np.zeros((3, arm.model.nv))
    mujoco.mj_jac(arm.model, arm.data, jac, None, arm.grasp_position(), arm._payload_body)
    push = np.array([2.0, -1.0, 1.5])
    arm.set_push(push)
    arm.advance(1.0)
    np.testing.assert_allclose(arm.truth().external_force, push)
    # At rest again the actuators cancel the push's joint torque J^T f (up to the small sag).
    _, after, _ = settled_average(arm)
    delivered_change = after - before
    expected = -jac[:, arm._dofadr].T @ push
    np.testing.assert_allclose(delivered_change, expected, atol=0.03 + 0.05 * np.abs(expected).max())


def test_contact_with_a_surface_reports_the_solver_force():
    arm = lossless_arm("omx", OMX_POSE)
    arm.advance(0.5)
    tip = arm.grasp_position()
    arm.set_surface(tip[2] - 0.004)                    # 4 mm below the probe sphere's centre
    jac = np.zeros((3, arm.model.nv))
    mujoco.mj_jac(arm.model, arm.data, jac, None, tip, arm._payload_body)
    jz = jac[2, arm._dofadr]
    arm.set_goal_vector(arm.joint_positions() + jz * (-0.03) / (jz @ jz))   # command 3 cm into it
    arm.advance(1.5)
    force = arm.truth().external_force
    assert force[2] > 1.0 and arm.truth().contact
    # Static balance: delivered torque = gravity - J^T f_contact.
    np.testing.assert_allclose(arm.truth().joint_torque, gravity_torque(arm) - jac[:, arm._dofadr].T @ force,
                               atol=0.05)
    arm.set_surface(None)
    arm.advance(0.5)
    assert np.linalg.norm(arm.truth().external_force) < 1e-6


def test_restricted_joint_is_labelled_and_harder_to_move():
    def tracking_error(restrict: bool) -> float:
        arm = SimulatedArm("so101", initial_position=SO101_POSE, seed=1)
        if restrict:
            arm.set_restriction(0, 0.6)
        errors = []
        for k in range(150):
            arm.set_goal_vector(SO101_POSE + np.array([0.4 * np.sin(k * 0.05), 0, 0, 0, 0, 0]))
            arm.advance(0.02)
            errors.append(abs(arm.bank.goal[0] - arm.joint_positions()[0]))
        assert arm.truth().condition[0] == (0.0 if restrict else 1.0)
        return float(np.mean(errors))

    assert tracking_error(True) > 1.5 * tracking_error(False)


def test_torque_off_lets_the_arm_fall():
    arm = SimulatedArm("so101", initial_position=SO101_POSE)
    arm.advance(0.5)
    held = arm.joint_positions()
    arm.set_torque_enabled(1, False)
    arm.advance(1.0)
    assert abs(arm.joint_positions()[1] - held[1]) > 0.05
    assert arm.servo_states()[1].load == 0.0 and arm.servo_states()[1].current == 0.0


def test_same_seed_same_telemetry_other_seed_other_noise():
    def run(seed):
        arm = SimulatedArm("so101", seed=seed, initial_position=SO101_POSE)
        arm.set_goal_vector(SO101_POSE + 0.2)
        out = []
        for _ in range(20):
            arm.advance(0.016)
            out.append([(s.position, s.load, s.current) for s in arm.servo_states()])
        return np.array(out)

    np.testing.assert_array_equal(run(3), run(3))
    assert not np.array_equal(run(3), run(4))


def test_panda_holds_its_pose_with_gravity_compensation_and_reports_torques():
    robot = load_robot("panda")
    pose = 0.5 * (np.array(robot.position_min) + np.array(robot.position_max))
    arm = SimulatedArm("panda", initial_position=pose)
    arm.advance(1.0)
    assert np.abs(arm.joint_positions() - pose).max() < 0.01
    np.testing.assert_allclose(arm.truth().joint_torque, gravity_torque(arm), atol=0.5)
    assert np.abs(arm.truth().joint_torque).max() > 5.0


def test_real_time_thread_tracks_the_wall_clock():
    arm = SimulatedArm("omx")
    arm.start()
    try:
        start = time.monotonic()
        time.sleep(0.5)
        elapsed = time.monotonic() - start
        assert arm.time == pytest.approx(elapsed, abs=0.2)
        arm.set_goal_positions({0: 0.3})              # the bus thread may write while it runs
        time.sleep(0.3)
    finally:
        arm.stop()
    assert arm.joint_positions()[0] > 0.1


def test_real_time_factor_is_measured():
    assert measure_real_time_factor("omx", seconds=0.2) > 0.0
