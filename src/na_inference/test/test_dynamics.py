"""The torch dynamics against MuJoCo as the oracle (float64, random states of the SO-101 description)."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

from na_description.robot_table import load_robot
from na_inference.dynamics import DynamicsError, RigidBodyDynamics, chain_from_mjmodel, load_mjmodel

TOL = 1e-10
SITE = load_robot("so101").frames["grasp_site"]


def oracle_model(friction: bool = False) -> mujoco.MjModel:
    """The SO-101 MJCF with constraints (joint limits, friction loss) and its position servos off: the
    torch model takes joint torques directly and has no constraint solver."""
    model = load_mjmodel(load_robot("so101"))
    off = mujoco.mjtDisableBit
    model.opt.disableflags |= off.mjDSBL_CONSTRAINT | off.mjDSBL_EULERDAMP | off.mjDSBL_ACTUATION
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    if not friction:
        model.dof_frictionloss[:] = 0.0
    return model


def random_states(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    table = load_robot("so101")
    q = rng.uniform(table.position_min, table.position_max, size=(count, 6))
    return q, rng.normal(0.0, 2.0, size=(count, 6)), rng.normal(0.0, 1.0, size=(count, 6))


def torch_dynamics(model: mujoco.MjModel) -> RigidBodyDynamics:
    chain = chain_from_mjmodel(model, load_robot("so101").joint_names, SITE)
    return RigidBodyDynamics(chain, torque_limit=load_robot("so101").actuator["torque_limit_nm"])


def test_mass_matrix_bias_and_jacobian_match_mujoco():
    model = oracle_model()
    data = mujoco.MjData(model)
    dyn = torch_dynamics(model)
    q, qd, _ = random_states(20)
    mass = dyn.mass_matrix(torch.from_numpy(q)).numpy()
    bias = dyn.bias_forces(torch.from_numpy(q), torch.from_numpy(qd)).numpy()
    jac = dyn.site_jacobian(torch.from_numpy(q)).numpy()
    site_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, SITE)
    for k in range(len(q)):
        data.qpos[:], data.qvel[:] = q[k], qd[k]
        mujoco.mj_forward(model, data)
        full = np.zeros((6, 6))
        mujoco.mj_fullM(model, data, full)
        jacp = np.zeros((3, 6))
        mujoco.mj_jacSite(model, data, jacp, None, site_id)
        np.testing.assert_allclose(mass[k], full, rtol=0, atol=TOL)
        np.testing.assert_allclose(bias[k], data.qfrc_bias, rtol=0, atol=TOL)
        np.testing.assert_allclose(jac[k], jacp, rtol=0, atol=TOL)
        np.testing.assert_allclose(dyn.site_position(torch.from_numpy(q[k:k + 1]))[0].numpy(), data.site_xpos[site_id], atol=TOL)


def test_forward_dynamics_with_damping_and_external_force_matches_mujoco():
    model = oracle_model()
    data = mujoco.MjData(model)
    dyn = torch_dynamics(model)
    q, qd, tau = random_states(10, seed=1)
    force = np.random.default_rng(2).normal(0.0, 3.0, size=(10, 3))
    qdd = dyn.forward_dynamics(torch.from_numpy(q), torch.from_numpy(qd), torch.from_numpy(tau),
                               torch.from_numpy(force)).numpy()
    site_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, SITE)
    for k in range(len(q)):
        data.qpos[:], data.qvel[:] = q[k], qd[k]
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        applied = tau[k].copy()
        # MuJoCo's own J^T f for a world force at the site point.
        mujoco.mj_applyFT(model, data, force[k], np.zeros(3), data.site_xpos[site_id],
                          int(model.site_bodyid[site_id]), applied)
        data.qfrc_applied[:] = applied
        mujoco.mj_forward(model, data)
        np.testing.assert_allclose(qdd[k], data.qacc, rtol=0, atol=TOL * max(1.0, np.abs(data.qacc).max()))


def test_semi_implicit_euler_with_substeps_matches_mj_step():
    model = oracle_model()
    data = mujoco.MjData(model)
    dyn = torch_dynamics(model)
    q, qd, tau = random_states(4, seed=3)
    dt, substeps = load_robot("so101").data_dt, 5
    q_next, qd_next = dyn.step(torch.from_numpy(q), torch.from_numpy(qd), torch.from_numpy(tau), dt, substeps)
    model.opt.timestep = dt / substeps
    for k in range(len(q)):
        mujoco.mj_resetData(model, data)
        data.qpos[:], data.qvel[:], data.qfrc_applied[:] = q[k], qd[k], tau[k]
        for _ in range(substeps):
            mujoco.mj_step(model, data)
        np.testing.assert_allclose(q_next[k].numpy(), data.qpos, rtol=0, atol=1e-10)
        np.testing.assert_allclose(qd_next[k].numpy(), data.qvel, rtol=0, atol=1e-9)


def test_torque_is_clipped_to_the_actuator_limit():
    dyn = RigidBodyDynamics.for_robot("so101")
    limit = load_robot("so101").actuator["torque_limit_nm"]
    q = torch.zeros(1, 6, dtype=torch.float64)
    big = torch.full((1, 6), 50.0, dtype=torch.float64)
    clipped = torch.full((1, 6), limit, dtype=torch.float64)
    a, _ = dyn.step(q, q, big, 0.01, 2)
    b, _ = dyn.step(q, q, clipped, 0.01, 2)
    assert torch.equal(a, b)
    assert torch.equal(dyn.clip_torque(-big), -clipped)


def test_smooth_friction_opposes_motion_and_saturates_at_frictionloss():
    dyn = RigidBodyDynamics.for_robot("so101")
    qd = torch.tensor([[10.0, -10.0, 0.0, 1e-6, 5.0, -5.0]], dtype=torch.float64)
    passive = dyn.passive_forces(qd)[0].numpy()
    dry = passive + dyn.damping.numpy() * qd[0].numpy()
    fast = [0, 1, 4, 5]
    np.testing.assert_allclose(dry[fast], -dyn.frictionloss.numpy()[fast] * np.sign(qd[0].numpy()[fast]), atol=1e-6)
    assert abs(dry[2]) == 0.0 and abs(dry[3]) < 1e-4  # smooth through zero velocity, no chattering


def test_gradients_flow_through_a_rollout_gradcheck():
    dyn = RigidBodyDynamics.for_robot("so101")
    q, qd, tau = (torch.tensor(v[:1], requires_grad=True) for v in random_states(1, seed=4))
    force = torch.tensor([[0.0, 0.0, -3.0]], dtype=torch.float64, requires_grad=True)

    def rollout(q0, qd0, torque, f):
        return dyn.step(q0, qd0, torque, 0.01605, 2, f)

    assert torch.autograd.gradcheck(rollout, (q, qd, tau, force), eps=1e-6, atol=1e-6)


def test_unknown_joint_and_site_give_clear_errors():
    model = oracle_model()
    with pytest.raises(DynamicsError, match="not in the description"):
        chain_from_mjmodel(model, ("shoulder_pan", "no_such_joint"))
    with pytest.raises(DynamicsError, match="site"):
        chain_from_mjmodel(model, None, "no_such_site")


def test_locked_joints_outside_the_table_stay_at_their_reference():
    """Simulating a subset of joints equals MuJoCo with the others held at qpos0."""
    model = oracle_model()
    data = mujoco.MjData(model)
    names = load_robot("so101").joint_names[:5]
    dyn = RigidBodyDynamics(chain_from_mjmodel(model, names))
    q, _, _ = random_states(3, seed=5)
    mass = dyn.mass_matrix(torch.from_numpy(q[:, :5])).numpy()
    for k in range(3):
        data.qpos[:5], data.qpos[5] = q[k, :5], model.qpos0[5]
        mujoco.mj_forward(model, data)
        full = np.zeros((6, 6))
        mujoco.mj_fullM(model, data, full)
        np.testing.assert_allclose(mass[k], full[:5, :5], atol=TOL)


def test_compiled_substeps_match_eager_values_and_gradients_for_any_batch():
    """The training path (torch.compile'd substeps, float32) must simulate exactly what the eager path does."""
    eager = RigidBodyDynamics.for_robot("so101", dtype=torch.float32)
    compiled = RigidBodyDynamics.for_robot("so101", dtype=torch.float32)
    if not compiled.compile_substeps():
        pytest.skip("no C++ compiler on PATH: torch.compile cannot build the substep")
    gen = torch.Generator().manual_seed(3)
    for batch in (5, 3):  # one compilation serves every batch size (training 16/256, validation 6)
        q0 = (torch.rand(batch, 6, generator=gen) - 0.5).requires_grad_()
        qd0 = torch.randn(batch, 6, generator=gen).requires_grad_()
        tau = torch.randn(batch, 6, generator=gen).requires_grad_()
        results = []
        for dyn in (eager, compiled):
            q, qd = dyn.step(q0, qd0, tau, 0.016, 5)
            q, qd = dyn.step(q, qd, tau, 0.016, 5)
            grads = torch.autograd.grad((q ** 2).sum() + qd.sum(), (q0, qd0, tau))
            results.append((q, qd, *grads))
        assert results[1][0].abs().sum() > 0
        for a, b in zip(*results):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_without_a_compiler_the_substeps_stay_eager(monkeypatch):
    monkeypatch.setattr("na_inference.dynamics.shutil.which", lambda name: None)
    dyn = RigidBodyDynamics.for_robot("so101", dtype=torch.float32)
    assert dyn.compile_substeps() is False
    q, qd = dyn.step(torch.zeros(2, 6), torch.zeros(2, 6), torch.zeros(2, 6), 0.016, 5)
    assert torch.isfinite(q).all() and torch.isfinite(qd).all()
