"""CommandLimiter arithmetic and DriverCore behaviour against an emulated bus (no ROS)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from na_description.robot_table import load_robot
from na_driver.bus import make_bus
from na_driver.driver_core import CommandLimiter, DriverCore
from na_sim.bus import FaultSpec, StaticBackend, make_emulator


def test_limiter_clamps_and_steps():
    lim = CommandLimiter(["a", "b"], [-1.0, -0.5], [1.0, 0.5], max_step=0.1)
    assert lim.set_command(["a"], [0.5]) == ["no position measured yet: command ignored"]
    assert lim.next_goal() is None
    np.testing.assert_allclose(lim.start_from(np.array([0.0, 2.0])), [0.0, 2.0])   # held as measured
    assert lim.next_goal() is None                                                 # no command: no write
    assert lim.set_command(["b", "a"], [0.0, 5.0]) == []
    goals = [lim.next_goal() for _ in range(30)]
    steps = np.abs(np.diff([[0.0, 2.0], *goals], axis=0))
    assert steps.max() <= 0.1 + 1e-12
    np.testing.assert_allclose(goals[-1], [1.0, 0.0])                              # clamped target reached
    problems = lim.set_command(["a", "zz", "b"], [math.nan, 0.2, 0.3])
    assert any("zz" in p for p in problems) and any("not finite" in p for p in problems)
    np.testing.assert_allclose(lim.target, [1.0, 0.3])                             # the good part applies
    assert lim.set_command(["a"], [0.1, 0.2]) == ["command has 1 names but 2 positions"]
    with pytest.raises(ValueError):
        CommandLimiter(["a"], [1.0], [0.0], 0.1)
    with pytest.raises(ValueError):
        CommandLimiter(["a"], [0.0], [1.0], math.nan)


def test_core_reopens_after_silent_servos_and_reengages_torque():
    robot = load_robot("so101")
    backend = StaticBackend(robot.n_joints)
    with make_emulator(robot, backend) as emulator:
        bus = make_bus(robot, emulator.path, quiet_s=0.002)
        limiter = CommandLimiter(robot.joint_names, robot.position_min, robot.position_max, 0.05)
        core = DriverCore(bus, limiter, reconnect_period_s=0.01, reopen_after_failures=3)
        assert core.cycle().sample is not None
        assert backend.torque_enabled == [True] * robot.n_joints
        emulator.set_faults(FaultSpec(drop=1.0))                  # servos silent (power cut)
        for _ in range(3):
            assert core.cycle().sample is None
        assert not bus.connected and "reopening" in core.last_error
        for j in range(robot.n_joints):                           # power back: torque off after reset
            backend.set_torque_enabled(j, False)
        emulator.set_faults(None)
        backend.set_state(0, position=0.4)
        deadline = 100
        while core.cycle().sample is None and deadline:
            deadline -= 1
            time.sleep(0.01)
        assert deadline, core.last_error
        assert core.counters.reconnects == 1
        assert backend.torque_enabled == [True] * robot.n_joints
        np.testing.assert_allclose(core.last_goal[0], 0.4, atol=0.002)   # held where it is, no jump
        assert "torque off" in core.shutdown()
        assert backend.torque_enabled == [False] * robot.n_joints
