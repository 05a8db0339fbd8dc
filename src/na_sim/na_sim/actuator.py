"""Servo actuator physics behind every simulated joint (pure numpy, vectorised over the joints).

One ``ServoBank`` models all servos of an arm: the firmware position loop (P/D gains in register
units, PWM saturation, dead band), the DC motor (supply voltage, winding resistance and inductance,
back-EMF, torque constant, gear ratio), the gearbox (Coulomb + Stribeck + viscous friction, load
dependent efficiency that differs when the motor drives the load and when the load back-drives the
motor, backlash), a two-node thermal model (winding heated by i^2 R; resistance and torque constant
drift with winding temperature), the supply sag of a shared power rail, and the sensors in register
units (encoder counts, velocity over the firmware's sampling window, PWM/load, supply current,
voltage and temperature quantisation plus noise).

The rigid-body side (MuJoCo) stays outside: each physics step the arm gives the bank the joint
angles and velocities and gets back the torque to apply and the friction capacities, which MuJoCo
enforces implicitly (``dof_frictionloss`` / ``dof_damping``) so stiction is exact and stable.
Parameters come from the robot table: ``actuator`` (datasheet values) and ``sim_actuator`` (the
simulator's own, tuned against real recordings; see na_sim's README).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from na_description.robot_table import RobotTable

# Error/status bits, the same in the STS3215 status byte and the XM430 Hardware_Error_Status.
ERROR_VOLTAGE, ERROR_OVERHEAT, ERROR_OVERLOAD = 1, 4, 32
COPPER_TEMP_COEFF = 0.00393  # 1/K, resistance drift of copper windings
THERMAL_EVERY = 10           # steps per thermal update (the heat is averaged; time constants are seconds)
REFERENCE_TEMP_C = 25.0


@dataclass(frozen=True)
class ServoParams:
    """Physical and firmware parameters of one robot's servos; floats broadcast over the joints."""

    gear_ratio: float = 345.0
    supply_voltage: float = 12.4          # V, open-circuit supply
    supply_resistance: float = 0.25       # ohm, shared rail (PSU + main cable): all servos sag together
    wire_resistance: float = 0.6          # ohm, per-servo cable/connector drop seen by its own sensor
    quiescent_current: float = 0.0        # A drawn by the electronics (not in the current register)
    motor_resistance: float = 4.8         # ohm at 25 degC
    motor_inductance: float = 0.5e-3      # H
    torque_constant: float = 0.0074       # N.m/A (motor side; = back-EMF constant V.s/rad)
    kt_temp_coeff: float = -0.002         # 1/K, magnet weakening with temperature
    efficiency_forward: float = 0.46      # motor drives the load
    efficiency_backward: float = 0.70     # load back-drives the motor (also: holding at rest)
    coulomb_friction: float = 0.03        # N.m at the output
    stribeck_friction: float = 0.02       # N.m extra breakaway torque near zero speed
    stribeck_velocity: float = 0.05       # rad/s
    viscous_friction: float = 0.05        # N.m.s/rad at the output
    backlash: float = 0.0035              # rad, half of the total play
    rotor_inertia: float = 0.028          # kg.m^2 reflected to the output (MuJoCo armature)
    duty_limit: float = 1.0               # torque-limit register as a fraction of full PWM
    p_gain: float = 32.0                  # position P coefficient (register)
    d_gain: float = 32.0                  # position D coefficient (register)
    duty_per_count_p: float = 1.25e-4     # duty per encoder count of error per unit of P
    duty_per_count_s_d: float = 2.0e-7    # duty per (count/s) of velocity per unit of D
    deadband_counts: float = 1.0          # firmware dead band around the goal (counts)
    feedforward_per_nm: float = 0.0       # duty per N.m of feed-forward torque (torque-controlled arms)
    counts_per_rev: float = 4096.0        # encoder resolution
    velocity_window_s: float = 0.02       # firmware velocity = count difference over this window
    load_quantum: float = 0.004           # duty step of the load/PWM register reading
    load_sign: float = 1.0                # register sign convention: +1 load positive with +q drive
    current_quantum: float = 0.0065       # A per current register count
    current_is_supply_side: bool = True   # STS3215 reports |duty * i_motor| (supply side)
    current_signed: bool = False          # XM430 reports the signed motor current
    velocity_quantum: float = 0.0         # rad/s per velocity count (0: only the window's resolution)
    voltage_quantum: float = 0.1          # V per voltage count
    voltage_sensor_offset: float = 0.0    # V, per-servo ADC/cable offset of the voltage reading
    temperature_quantum: float = 1.0      # degC per temperature count
    position_noise_counts: float = 0.3    # std of encoder noise before quantisation
    load_noise: float = 0.002             # std of the PWM reading noise (duty)
    ambient_temp: float = 30.0            # degC
    winding_heat_capacity: float = 2.0    # J/K
    case_heat_capacity: float = 25.0      # J/K
    winding_to_case: float = 6.0          # K/W
    case_to_ambient: float = 12.0         # K/W
    temperature_limit: float = 70.0       # degC: above it the overheat bit is set
    voltage_min: float = 4.0              # V: outside min..max the voltage bit is set
    voltage_max: float = 14.0
    overload_duty: float = 0.9            # |duty| demanded at or above this ...
    overload_time_s: float = 2.0          # ... for this long trips the overload protection
    protective_duty: float = 0.2          # STS: output limited to this after an overload
    overload_shutdown: bool = False       # XM430: an overload switches the torque off instead
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_robot(cls, robot: RobotTable, **overrides: Any) -> ServoParams:
        """Datasheet values from ``actuator``, the simulator's own from ``sim_actuator``, then overrides."""
        act = robot.actuator
        values: dict[str, Any] = {}
        if "gear_ratio" in act:
            values["gear_ratio"] = act["gear_ratio"]
        if "nominal_voltage_v" in act:
            values["supply_voltage"] = act["nominal_voltage_v"]
        # Motor constant from the no-load speed (back-EMF ~ supply at no load); resistance from the
        # stall current when the datasheet gives it; efficiency then reconciles the stall torque.
        if {"gear_ratio", "no_load_speed_rad_s", "nominal_voltage_v"} <= act.keys():
            kt = float(act["nominal_voltage_v"]) / float(act["no_load_speed_rad_s"]) / float(act["gear_ratio"])
            values["torque_constant"] = kt
            if "stall_current_a" in act and "stall_torque_nm" in act:
                values["motor_resistance"] = float(act["nominal_voltage_v"]) / float(act["stall_current_a"])
                values["efficiency_forward"] = float(act["stall_torque_nm"]) / (
                    kt * float(act["gear_ratio"]) * float(act["stall_current_a"]))
        # Register resolutions from the bus units (the sim reports exactly what the registers can hold).
        units = robot.bus.units
        if "pwm_full_scale" in units:
            values["load_quantum"] = 1.0 / units["pwm_full_scale"]
        elif "load_full_scale" in units:
            values["load_quantum"] = 1.0 / units["load_full_scale"]
        if "current_a_per_count" in units:
            values["current_quantum"] = units["current_a_per_count"]
        if "voltage_v_per_count" in units:
            values["voltage_quantum"] = units["voltage_v_per_count"]
        if "temperature_c_per_count" in units:
            values["temperature_quantum"] = units["temperature_c_per_count"]
        if "velocity_rpm_per_count" in units:
            values["velocity_quantum"] = units["velocity_rpm_per_count"] * 2.0 * math.pi / 60.0
        if "position_steps_per_rev" in units:
            values["counts_per_rev"] = units["position_steps_per_rev"]
        power_up = robot.bus.extra.get("power_up", {})
        temperature_limit = power_up.get("max_temperature_limit", power_up.get("temperature_limit"))
        if temperature_limit is not None:
            values["temperature_limit"] = float(temperature_limit) * units.get("temperature_c_per_count", 1.0)
        for key in ("min_voltage_limit", "max_voltage_limit"):
            if key in power_up:
                values[f"voltage_{key[:3]}"] = float(power_up[key]) * units.get("voltage_v_per_count", 0.1)
        armature = act.get("mjcf_joint_class", {}).get("armature")
        if armature is not None:
            values["rotor_inertia"] = armature
        names = {f.name for f in fields(cls)}
        for key, value in robot.raw.get("sim_actuator", {}).items():
            if key not in names:
                raise ValueError(f"{robot.name}.yaml sim_actuator has unknown key {key!r}")
            values[key] = value
        defaults = robot.bus.defaults
        if "p_coefficient" in defaults and "p_gain" not in values:
            values["p_gain"] = defaults["p_coefficient"]
        if "d_coefficient" in defaults and "d_gain" not in values:
            values["d_gain"] = defaults["d_coefficient"]
        if "position_p_gain" in defaults and "p_gain" not in values:
            values["p_gain"] = defaults["position_p_gain"]
        if "position_d_gain" in defaults and "d_gain" not in values:
            values["d_gain"] = defaults["position_d_gain"]
        values.update(overrides)
        return cls(**{k: (np.asarray(v, dtype=float) if isinstance(v, list) else v) for k, v in values.items()})

    def with_values(self, **changes: Any) -> ServoParams:
        return replace(self, **changes)


@dataclass
class ServoReadings:
    """What the servos' sensors report, in SI units but already quantised to register steps."""

    position: np.ndarray      # rad
    velocity: np.ndarray      # rad/s
    load: np.ndarray          # signed duty fraction in the register's sign convention
    current: np.ndarray       # A
    voltage: np.ndarray       # V
    temperature: np.ndarray   # degC
    moving: np.ndarray        # bool
    error: np.ndarray         # int error/status bits (ERROR_*)


class ServoBank:
    """The servos of one arm. ``step`` advances them by ``dt`` given the joint state from MuJoCo."""

    def __init__(self, params: ServoParams, n_joints: int, rng: np.random.Generator | None = None,
                 timestep: float = 0.001) -> None:
        self.params = params
        self.n = n_joints
        self.dt = timestep
        self.v = self._per_joint()
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.goal = np.zeros(n_joints)
        self.torque_enabled = np.ones(n_joints, dtype=bool)
        self.extra_friction = np.zeros(n_joints)     # restricted-joint scenario (N.m)
        self.overload_timer = np.zeros(n_joints)     # s the demand has been at the overload level
        self.overloaded = np.zeros(n_joints, dtype=bool)
        self.feedforward = np.zeros(n_joints)        # N.m (e.g. gravity compensation of the Panda)
        self.p_gain = np.broadcast_to(np.asarray(params.p_gain, float), (n_joints,)).copy()
        self.d_gain = np.broadcast_to(np.asarray(params.d_gain, float), (n_joints,)).copy()
        window = max(1, round(params.velocity_window_s / timestep))
        self._count_history = np.zeros((window + 1, n_joints))
        self._history_filled = False
        self._history_index = 0
        self.current = np.zeros(n_joints)            # motor winding current (A)
        self.duty = np.zeros(n_joints)
        self.gap = np.full(n_joints, 0.0)            # backlash position of the motor side (rad)
        self.gap_velocity = np.zeros(n_joints)
        self.winding_temp = np.full(n_joints, float(params.ambient_temp))
        self.case_temp = np.full(n_joints, float(params.ambient_temp))
        self.bus_voltage = np.full(n_joints, float(np.max(params.supply_voltage)))
        self.supply_current = np.zeros(n_joints)
        self.transmitted_torque = np.zeros(n_joints)
        self.counts = np.zeros(n_joints)
        self.velocity_counts = np.zeros(n_joints)
        self._heat = np.zeros(n_joints)              # J accumulated since the last thermal update
        self._heat_steps = 0
        self._has_backlash = bool(np.any(self.v["backlash"] > 0))

    # -- helpers ---------------------------------------------------------------------------------
    def _vec(self, value: Any) -> np.ndarray:
        return np.broadcast_to(np.asarray(value, dtype=float), (self.n,))

    def _per_joint(self) -> dict[str, np.ndarray]:
        """Every numeric parameter as a per-joint array, computed once (the step is hot)."""
        out = {}
        for f in fields(self.params):
            value = getattr(self.params, f.name)
            if isinstance(value, (int, float, np.ndarray)) and not isinstance(value, bool):
                out[f.name] = self._vec(value).copy()
        return out

    def rad_to_counts(self, q: np.ndarray) -> np.ndarray:
        return np.asarray(q) * (self.params.counts_per_rev / (2.0 * math.pi))

    def counts_to_rad(self, c: np.ndarray) -> np.ndarray:
        return np.asarray(c) * (2.0 * math.pi / self.params.counts_per_rev)

    def resistance(self) -> np.ndarray:
        return self.v["motor_resistance"] * (
            1.0 + COPPER_TEMP_COEFF * (self.winding_temp - REFERENCE_TEMP_C))

    def torque_constant(self) -> np.ndarray:
        return self.v["torque_constant"] * (
            1.0 + self.v["kt_temp_coeff"] * (self.winding_temp - REFERENCE_TEMP_C))

    def reset(self, q: np.ndarray) -> None:
        """Start at rest at joint angles ``q``, holding them as the goal."""
        self.goal = np.asarray(q, dtype=float).copy()
        counts = np.round(self.rad_to_counts(q))
        self._count_history[:] = counts
        self.counts = counts
        self.velocity_counts[:] = 0.0

    # -- one physics step ------------------------------------------------------------------------
    def sense_position(self, q: np.ndarray) -> np.ndarray:
        """Encoder reading in counts: quantised, with noise (the firmware loop and telemetry use it)."""
        noise = self.rng.normal(0.0, 1.0, self.n) * self.params.position_noise_counts
        return np.round(self.rad_to_counts(q) + noise)

    def step(self, q: np.ndarray, qd: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Advance by one timestep; returns (torque on the joint, friction capacity, viscous coeff)."""
        p, dt = self.params, self.dt
        gear = self.v["gear_ratio"]
        # Sensors the firmware sees.
        self.counts = self.sense_position(q)
        self._history_index = (self._history_index + 1) % len(self._count_history)
        self._count_history[self._history_index] = self.counts
        oldest = self._count_history[(self._history_index + 1) % len(self._count_history)]
        window = (len(self._count_history) - 1) * dt
        self.velocity_counts = (self.counts - oldest) / window
        # Firmware position loop -> PWM duty.
        error = np.round(self.rad_to_counts(self.goal)) - self.counts
        error = np.where(np.abs(error) <= self.v["deadband_counts"], 0.0, error)
        duty = (self.p_gain * self.v["duty_per_count_p"] * error
                - self.d_gain * self.v["duty_per_count_s_d"] * self.velocity_counts
                + self.v["feedforward_per_nm"] * self.feedforward)
        limit = self.v["duty_limit"]
        duty = np.clip(duty, -limit, limit)
        duty = self._protect(duty, dt)
        self.duty = np.where(self.torque_enabled, duty, 0.0)
        # DC motor: first-order winding current with back-EMF, exact exponential discretisation.
        resistance, kt = self.resistance(), self.torque_constant()
        motor_speed = (np.asarray(qd) + self.gap_velocity) * gear
        voltage = self.duty * self.bus_voltage
        i_steady = (voltage - kt * motor_speed) / resistance
        decay = np.exp(-dt * resistance / self.v["motor_inductance"])
        current = i_steady + (self.current - i_steady) * decay
        self.current = np.where(self.torque_enabled, current, 0.0)   # bridge off: no current path
        motor_torque = kt * self.current * gear                      # at the output, before losses
        transmitted = self._backlash(motor_torque, dt)
        self.transmitted_torque = transmitted
        # Gearbox losses as a friction capacity for MuJoCo's implicit dry-friction constraint.
        driving = transmitted * np.asarray(qd) > 0.0
        efficiency = np.where(driving, self.v["efficiency_forward"], self.v["efficiency_backward"])
        speed = np.abs(np.asarray(qd))
        stribeck = self.v["stribeck_friction"] * np.exp(-(speed / self.v["stribeck_velocity"]) ** 2)
        friction = (self.v["coulomb_friction"] + stribeck + (1.0 - efficiency) * np.abs(transmitted)
                    + self.extra_friction)
        # Heat, supply current and rail sag for the next step.
        self._heat += self.current**2 * resistance * dt
        self._heat_steps += 1
        if self._heat_steps >= THERMAL_EVERY:
            self._thermal(self._heat_steps * dt)
        self.supply_current = self.duty * self.current
        total = np.sum(self.supply_current) + float(p.quiescent_current) * self.n
        self.bus_voltage = (float(p.supply_voltage) - float(p.supply_resistance) * total
                            - self.v["wire_resistance"] * self.supply_current)
        return transmitted, friction, self.v["viscous_friction"].copy()

    def _protect(self, duty: np.ndarray, dt: float) -> np.ndarray:
        """Overload protection: a sustained near-full demand limits the output (STS) or trips the
        torque off (XM430) and sets the overload bit; the STS recovers when the demand drops."""
        p = self.params
        demanding = self.torque_enabled & (np.abs(duty) >= self.v["overload_duty"])
        self.overload_timer = np.where(demanding, self.overload_timer + dt, 0.0)
        tripped = self.overload_timer >= self.v["overload_time_s"]
        if p.overload_shutdown:
            self.overloaded |= tripped
            self.torque_enabled &= ~tripped
            return duty
        protective = self.v["protective_duty"]
        self.overloaded = (self.overloaded | tripped) & (np.abs(duty) > protective)
        return np.where(self.overloaded, np.clip(duty, -protective, protective), duty)

    def set_torque(self, joint: int, enabled: bool) -> None:
        """Torque_Enable write: switching on clears a latched overload (as a reboot/re-enable does)."""
        self.torque_enabled[joint] = bool(enabled)
        if enabled:
            self.overloaded[joint] = False
            self.overload_timer[joint] = 0.0

    def _backlash(self, motor_torque: np.ndarray, dt: float) -> np.ndarray:
        """Lost motion: torque passes only while the gear teeth touch on the side it pushes towards."""
        if not self._has_backlash:
            return motor_torque
        half_play = self.v["backlash"]
        inertia = self.v["rotor_inertia"]
        engaged = (np.abs(self.gap) >= half_play - 1e-12) & (np.sign(self.gap) == np.sign(motor_torque))
        if engaged.all():
            return motor_torque
        # Teeth apart: the motor side accelerates alone across the gap, nothing reaches the link.
        free = ~engaged & (half_play > 0)
        self.gap_velocity = np.where(free, self.gap_velocity + motor_torque / inertia * dt, 0.0)
        self.gap = np.where(free, self.gap + self.gap_velocity * dt, self.gap)
        hit = free & (np.abs(self.gap) >= half_play)
        self.gap = np.clip(self.gap, -half_play, half_play)
        self.gap_velocity = np.where(hit, 0.0, self.gap_velocity)
        return np.where(engaged | (half_play <= 0), motor_torque, 0.0)

    def _thermal(self, dt: float) -> None:
        """Two-node heat flow over ``dt`` with the winding heat accumulated since the last update."""
        p = self.params
        heat = self._heat / dt
        self._heat = np.zeros(self.n)
        self._heat_steps = 0
        to_case = (self.winding_temp - self.case_temp) / self.v["winding_to_case"]
        to_air = (self.case_temp - float(p.ambient_temp)) / self.v["case_to_ambient"]
        self.winding_temp = self.winding_temp + dt * (heat - to_case) / self.v["winding_heat_capacity"]
        self.case_temp = self.case_temp + dt * (to_case - to_air) / self.v["case_heat_capacity"]

    # -- what the registers say -------------------------------------------------------------------
    def readings(self) -> ServoReadings:
        p = self.params
        rng = self.rng
        position = self.counts_to_rad(self.counts)
        velocity = self.counts_to_rad(self.velocity_counts)
        if float(p.velocity_quantum) > 0:
            velocity = np.round(velocity / float(p.velocity_quantum)) * float(p.velocity_quantum)
        load_q = float(p.load_quantum)
        load = self.v["load_sign"] * (self.duty + rng.normal(0.0, float(p.load_noise), self.n))
        load = np.clip(np.round(load / load_q) * load_q, -1.0, 1.0)
        raw_current = self.supply_current if p.current_is_supply_side else self.current
        raw_current = raw_current if p.current_signed else np.abs(raw_current)
        current = np.round(raw_current / float(p.current_quantum)) * float(p.current_quantum)
        voltage = self.bus_voltage + self.v["voltage_sensor_offset"]
        voltage = np.round(voltage / float(p.voltage_quantum)) * float(p.voltage_quantum)
        temperature = np.round(self.case_temp / float(p.temperature_quantum)) * float(p.temperature_quantum)
        moving = np.abs(self.velocity_counts) > 0.5
        error = np.zeros(self.n, dtype=int)
        error |= np.where((voltage < self.v["voltage_min"]) | (voltage > self.v["voltage_max"]), ERROR_VOLTAGE, 0)
        error |= np.where(temperature > self.v["temperature_limit"], ERROR_OVERHEAT, 0)
        error |= np.where(self.overloaded, ERROR_OVERLOAD, 0)
        return ServoReadings(position, velocity, load, current, voltage, temperature, moving, error)
