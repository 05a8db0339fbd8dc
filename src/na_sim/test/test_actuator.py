"""The servo model alone (no MuJoCo): position loop, electrics, heat, backlash, register quantisation."""

import math

import numpy as np
import pytest

from na_description.robot_table import load_robot
from na_sim.actuator import ERROR_OVERHEAT, ERROR_OVERLOAD, ERROR_VOLTAGE, ServoBank, ServoParams


def so101_params(**changes) -> ServoParams:
    """SO-101 servo parameters for a bank of any size (per-servo sensor offsets dropped)."""
    return ServoParams.from_robot(load_robot("so101"), **{"voltage_sensor_offset": 0.0, **changes})


def test_params_come_from_the_robot_table():
    robot = load_robot("so101")
    params = ServoParams.from_robot(robot)
    assert params.gear_ratio == robot.actuator["gear_ratio"]
    assert params.load_sign == robot.raw["sim_actuator"]["load_sign"]
    assert params.p_gain == robot.bus.defaults["p_coefficient"]
    # Back-EMF constant from the no-load speed: at full duty the free motor turns at no-load speed.
    kt_out = params.torque_constant * params.gear_ratio
    assert kt_out * robot.actuator["no_load_speed_rad_s"] == pytest.approx(robot.actuator["nominal_voltage_v"])
    omx = ServoParams.from_robot(load_robot("omx"))
    # XM430 datasheet: stall 4.1 N.m at 2.3 A, 12 V -> R = 12 / 2.3 and a plausible efficiency.
    assert omx.motor_resistance == pytest.approx(12.0 / 2.3)
    assert 0.5 < omx.efficiency_forward < 0.9


def test_unknown_sim_actuator_key_is_a_clear_error():
    robot = load_robot("so101")
    broken = type(robot)(**{**robot.__dict__, "raw": {**robot.raw, "sim_actuator": {"gear_ration": 3}}})
    with pytest.raises(ValueError, match="gear_ration"):
        ServoParams.from_robot(broken)


def test_stalled_motor_draws_supply_limited_current_and_heats_then_cools():
    params = so101_params(position_noise_counts=0.0, overload_duty=2.0)   # protection off: pure heat
    bank = ServoBank(params, 1, np.random.default_rng(0), timestep=0.01)   # heat is slow: 10 ms steps
    bank.reset(np.zeros(1))
    bank.goal[:] = 0.5                                  # far away: the loop saturates the PWM
    q, qd = np.zeros(1), np.zeros(1)
    start_temp = bank.readings().temperature[0]
    for _ in range(4_000):                              # 40 s stalled (the joint is held)
        bank.step(q, qd)
    hot = bank.readings()
    assert bank.duty[0] == pytest.approx(params.duty_limit)
    stall_current = bank.bus_voltage[0] / bank.resistance()[0]
    assert bank.current[0] == pytest.approx(stall_current, rel=0.02)
    # Supply-side current register: duty * motor current, quantised to 6.5 mA.
    assert hot.current[0] == pytest.approx(bank.duty[0] * bank.current[0], abs=params.current_quantum)
    assert hot.temperature[0] >= start_temp + 3
    assert bank.winding_temp[0] > bank.case_temp[0]
    # Hot copper: higher resistance, weaker magnets.
    assert bank.resistance()[0] > params.motor_resistance
    assert bank.torque_constant()[0] < params.torque_constant
    # Supply sag under load.
    assert hot.voltage[0] < params.supply_voltage - 0.3
    bank.torque_enabled[:] = False
    peak = hot.temperature[0]
    for _ in range(15_000):                             # 150 s at rest: the winding heat soaks out
        bank.step(q, qd)
        peak = max(peak, bank.case_temp[0])
    cool = bank.readings()
    assert cool.temperature[0] <= peak - 2
    assert cool.voltage[0] == pytest.approx(params.supply_voltage, abs=0.05)
    assert cool.current[0] == 0.0


def test_position_loop_is_proportional_with_saturation_and_dead_band():
    params = so101_params(position_noise_counts=0.0, load_noise=0.0)
    bank = ServoBank(params, 3, np.random.default_rng(0), timestep=0.001)
    bank.reset(np.zeros(3))
    counts = np.array([1.0, 20.0, 2000.0])               # error in encoder counts
    bank.goal[:] = counts * 2 * math.pi / params.counts_per_rev
    bank.step(np.zeros(3), np.zeros(3))
    expected = np.minimum(params.p_gain * params.duty_per_count_p * counts, params.duty_limit)
    expected[0] = 0.0                                    # inside the 1-count dead band
    np.testing.assert_allclose(bank.duty, expected)
    # The register reports it in its own sign convention, in steps of the load quantum.
    load = bank.readings().load
    np.testing.assert_allclose(load, params.load_sign * np.round(expected / params.load_quantum) * params.load_quantum)


def test_velocity_register_has_the_firmware_window_resolution():
    params = so101_params(position_noise_counts=0.0)
    bank = ServoBank(params, 1, np.random.default_rng(0), timestep=0.001)
    bank.reset(np.zeros(1))
    speed = 0.3                                          # rad/s
    for k in range(1, 200):
        bank.step(np.array([speed * k * 0.001]), np.array([speed]))
    reading = bank.readings().velocity[0]
    step = 2 * math.pi / params.counts_per_rev / params.velocity_window_s   # one count per window
    assert reading == pytest.approx(speed, abs=step)
    assert (reading / step) == pytest.approx(round(reading / step))


def test_backlash_delays_torque_reversal():
    params = so101_params(position_noise_counts=0.0, backlash=0.005)
    bank = ServoBank(params, 1, np.random.default_rng(0), timestep=0.001)
    bank.reset(np.zeros(1))
    bank.goal[:] = 0.02
    for _ in range(200):                                 # teeth close on the + side
        torque, _, _ = bank.step(np.zeros(1), np.zeros(1))
    assert torque[0] > 0 and bank.gap[0] == pytest.approx(0.005)
    bank.goal[:] = -0.02                                 # reverse: the motor crosses the gap first
    transmitted = []
    for _ in range(300):
        torque, _, _ = bank.step(np.zeros(1), np.zeros(1))
        transmitted.append(torque[0])
    transmitted = np.array(transmitted)
    assert transmitted[0] == 0.0
    first = int(np.argmax(transmitted < 0))
    assert first > 3                                     # several ms with no torque at the link
    assert bank.gap[0] == pytest.approx(-0.005)


def test_friction_capacity_depends_on_direction_and_speed():
    params = so101_params(efficiency_forward=0.46, efficiency_backward=0.7)
    bank = ServoBank(params, 2, np.random.default_rng(0), timestep=0.001)
    bank.reset(np.zeros(2))
    bank.goal[:] = [0.05, 0.05]
    # Same motor torque: joint 0 moves with it (driving), joint 1 against it (back-driven).
    for _ in range(50):
        torque, friction, _ = bank.step(np.zeros(2), np.array([0.1, -0.1]))
    assert torque[0] > 0
    assert friction[0] > friction[1]                     # forward efficiency is the lower one
    # Stribeck: with the motor off, the breakaway friction at standstill exceeds the sliding one.
    bank.torque_enabled[:] = False
    _, still, _ = bank.step(np.zeros(2), np.zeros(2))
    _, sliding, _ = bank.step(np.zeros(2), np.array([2.0, -2.0]))
    np.testing.assert_allclose(still, params.coulomb_friction + params.stribeck_friction)
    np.testing.assert_allclose(sliding, params.coulomb_friction, atol=1e-6)


def test_sts_overload_limits_the_output_and_recovers_when_the_demand_drops():
    params = so101_params(position_noise_counts=0.0)
    bank = ServoBank(params, 1, np.random.default_rng(0), timestep=0.001)
    bank.reset(np.zeros(1))
    bank.goal[:] = 0.5                                   # blocked far from its goal: full demand
    q, qd = np.zeros(1), np.zeros(1)
    for _ in range(int(params.overload_time_s * 1000) - 10):
        bank.step(q, qd)
    assert bank.duty[0] == pytest.approx(params.duty_limit) and bank.readings().error[0] == 0
    for _ in range(20):
        bank.step(q, qd)
    assert bank.duty[0] == pytest.approx(params.protective_duty)   # the NAD gripper's pinned load 200
    assert bank.readings().error[0] & ERROR_OVERLOAD
    bank.goal[:] = 0.0                                   # obstacle gone, demand below the limit
    bank.step(q, qd)
    assert bank.readings().error[0] == 0 and bank.torque_enabled[0]


def test_xm430_overload_switches_the_torque_off_until_re_enabled():
    params = ServoParams.from_robot(load_robot("omx"), position_noise_counts=0.0)
    assert params.overload_shutdown
    bank = ServoBank(params, 5, np.random.default_rng(0), timestep=0.001)
    bank.reset(np.zeros(5))
    bank.goal[1] = 1.0
    for _ in range(int(params.overload_time_s * 1000) + 10):
        bank.step(np.zeros(5), np.zeros(5))
    assert not bank.torque_enabled[1] and bank.torque_enabled[0]
    assert bank.readings().error[1] & ERROR_OVERLOAD and bank.duty[1] == 0.0
    bank.set_torque(1, True)
    assert bank.readings().error[1] == 0


def test_overheat_and_voltage_bits():
    params = so101_params()
    bank = ServoBank(params, 2, np.random.default_rng(0), timestep=0.001)
    bank.reset(np.zeros(2))
    bank.case_temp[0] = params.temperature_limit + 2
    bank.bus_voltage[1] = params.voltage_max + 1
    error = bank.readings().error
    assert error[0] == ERROR_OVERHEAT and error[1] == ERROR_VOLTAGE
