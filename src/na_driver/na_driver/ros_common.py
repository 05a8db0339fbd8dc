"""Small ROS helpers shared by the na_driver nodes: parameter declaration, message building, diagnostics."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.node import Node
from sensor_msgs.msg import JointState

from na_driver.bus import TelemetrySample
from na_msgs.msg import ActuatorState


def declare(node: Node, name: str, default, description: str, *, float_range: tuple[float, float] | None = None,
            int_range: tuple[int, int] | None = None, read_only: bool = True):
    """Declare a parameter with a description and (optionally) a range; returns its value."""
    is_float = isinstance(default, float)
    # dynamic typing for floats so `rate_hz:=100` (an int on the command line) is accepted; the range is
    # then checked here, since ROS checks a FloatingPointRange only against double values
    descriptor = ParameterDescriptor(description=description, read_only=read_only, dynamic_typing=is_float)
    if float_range is not None:
        descriptor.floating_point_range = [FloatingPointRange(from_value=float(float_range[0]),
                                                              to_value=float(float_range[1]), step=0.0)]
    if int_range is not None:
        descriptor.integer_range = [IntegerRange(from_value=int(int_range[0]), to_value=int(int_range[1]), step=1)]
    value = node.declare_parameter(name, default, descriptor).value
    if is_float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SystemExit(f"{node.get_name()}: parameter {name} must be a number, got {value!r}")
        value = float(value)
        if float_range is not None and not float_range[0] <= value <= float_range[1]:
            raise SystemExit(f"{node.get_name()}: parameter {name}={value} is outside "
                             f"[{float_range[0]}, {float_range[1]}] ({description})")
    return value


def stamp_from_ns(ns: int) -> Time:
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def actuator_state_msg(names: Sequence[str], sample: TelemetrySample, goal: np.ndarray | None) -> ActuatorState:
    msg = ActuatorState()
    msg.header.stamp = stamp_from_ns(sample.stamp_ns)
    msg.name = list(names)
    msg.position = sample.position.tolist()
    msg.velocity = sample.velocity.tolist()
    msg.goal_position = goal.tolist() if goal is not None else [math.nan] * len(names)
    msg.current = sample.current.tolist()
    msg.load = sample.load.tolist()
    msg.voltage = sample.voltage.tolist()
    msg.temperature = sample.temperature.tolist()
    msg.hardware_error = [int(e) & 0xFF for e in sample.hardware_error]
    return msg


def joint_state_msg(names: Sequence[str], sample: TelemetrySample) -> JointState:
    msg = JointState()
    msg.header.stamp = stamp_from_ns(sample.stamp_ns)
    msg.name = list(names)
    msg.position = sample.position.tolist()
    msg.velocity = sample.velocity.tolist()
    return msg


def status(name: str, level: bytes, message: str, hardware_id: str, values: dict) -> DiagnosticStatus:
    return DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                            values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
