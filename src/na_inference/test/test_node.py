"""inference_node in its own process, over real Fast DDS: outputs, stamps, frames, and every bad-input case
(no crash, the right /diagnostics level and message)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from geometry_msgs.msg import WrenchStamped  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from visualization_msgs.msg import Marker  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from runtime_models import contract_model  # noqa: E402

from na_description.robot_table import load_robot  # noqa: E402
from na_inference.engine import InferenceEngine, derived_telemetry  # noqa: E402
from na_inference.kinematics import SerialChain  # noqa: E402
from na_msgs.msg import ActuatorState, ExternalForceEstimate, MotorCondition  # noqa: E402

pytestmark = pytest.mark.ros

ROBOT = load_robot("so101")
JOINTS = list(ROBOT.joint_names)
OUTPUT_TOPICS = {
    "/estimated_joint_torques": JointState,
    "/external_wrench": WrenchStamped,
    "/external_force": ExternalForceEstimate,
    "/motor_condition": MotorCondition,
    "/external_wrench_marker": Marker,
}
OK, WARN, ERROR = 0, 1, 2
T0 = 1_700_000_000.0


def telemetry(i: int) -> dict[str, np.ndarray]:
    """A smooth, plausible SO-101 sample (physical units) for step ``i``."""
    phase = 0.05 * i + np.arange(len(JOINTS))
    position = 0.4 * np.sin(phase)
    return {"position": position, "goal_position": position + 0.02 * np.cos(phase),
            "velocity": 0.3 * np.cos(phase), "load": 0.2 * np.sin(2 * phase), "current": 0.1 + 0.05 * np.sin(phase),
            "voltage": np.full(len(JOINTS), 12.1), "temperature": np.full(len(JOINTS), 31.0)}


def to_msg(stamp: float, sample: dict[str, np.ndarray], names: list[str] | None = None) -> ActuatorState:
    names = names or JOINTS
    order = [JOINTS.index(n) for n in names]
    msg = ActuatorState()
    msg.header.stamp.sec = int(stamp)
    msg.header.stamp.nanosec = round((stamp - int(stamp)) * 1e9)
    msg.name = names
    for field in ("position", "goal_position", "velocity", "load", "current", "voltage", "temperature"):
        setattr(msg, field, [float(sample[field][k]) for k in order])
    msg.hardware_error = [0] * len(names)
    return msg


def stamp_of(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


class Harness:
    """The test's side of DDS: publishes telemetry, collects every output and diagnostics."""

    def __init__(self) -> None:
        rclpy.init()
        self.node = Node("inference_node_test")
        self.pub = self.node.create_publisher(ActuatorState, "/actuator_states", qos_profile_sensor_data)
        self.received: dict[str, list] = {topic: [] for topic in OUTPUT_TOPICS}
        self.subs = [self.node.create_subscription(kind, topic, self.received[topic].append, qos_profile_sensor_data)
                     for topic, kind in OUTPUT_TOPICS.items()]
        self.diagnostics: list[DiagnosticArray] = []
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 50)

    def close(self) -> None:
        self.node.destroy_node()
        rclpy.shutdown()

    def spin_until(self, predicate, timeout: float, what: str, proc=None) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"inference_node exited ({proc.returncode}): {proc.communicate()[0]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            rclpy.spin_once(self.node, timeout_sec=0.01)

    def wait_connected(self, proc) -> None:
        self.spin_until(lambda: self.pub.get_subscription_count() > 0
                        and all(s.get_publisher_count() > 0 for s in self.subs) and self.diagnostics,
                        40.0, "the inference node to match every topic", proc)

    def send_and_wait(self, stamp: float, msg: ActuatorState, proc) -> dict[str, object]:
        """Publish one sample that completes a model step; return its output on every topic."""
        self.pub.publish(msg)
        found: dict[str, object] = {}

        def all_arrived() -> bool:
            for topic, messages in self.received.items():
                if topic not in found:
                    for m in reversed(messages):
                        if abs(stamp_of(m) - stamp) < 1e-9:
                            found[topic] = m
                            break
            return len(found) == len(OUTPUT_TOPICS)

        self.spin_until(all_arrived, 10.0, f"outputs stamped {stamp:.6f}", proc)
        return found

    def wait_status(self, suffix: str, level: int, text: str, proc, timeout: float = 10.0, since: int | None = None):
        """Wait for a diagnostics status named '*: <suffix>' at ``level`` whose message contains ``text``,
        among the reports from index ``since`` on (default: from now)."""
        start = len(self.diagnostics) if since is None else since
        hit: list = []

        def seen() -> bool:
            for array in self.diagnostics[start:]:
                for status in array.status:
                    if status.name.endswith(suffix) and status.level == bytes([level]) and text in status.message:
                        hit.append(status)
                        return True
            return False

        self.spin_until(seen, timeout, f"{suffix} diagnostics level {level} with {text!r}", proc)
        return hit[0]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return contract_model("so101").path


@pytest.fixture
def harness():
    h = Harness()
    try:
        yield h
    finally:
        h.close()


def start_node(processes, model: Path, **params):
    args = ["-m", "na_inference.node", "--ros-args", "-p", f"model_path:={model}", "-p", "diagnostics_period:=0.2"]
    for key, value in params.items():
        args += ["-p", f"{key}:={value}"]
    return processes.python(args)


@pytest.mark.parametrize("wrench_frame", ["base", "end_effector"])
def test_outputs_match_the_engine_and_carry_the_input_stamp(processes, harness, model_path, wrench_frame):
    proc = start_node(processes, model_path, wrench_frame=wrench_frame, contact_threshold=0.3)
    harness.wait_connected(proc)
    reference = InferenceEngine(model_path, "so101")
    chain = SerialChain.from_robot(ROBOT)
    scrambled = JOINTS[3:] + JOINTS[:3]  # the node maps by name, not by position
    for i in range(20):
        stamp = T0 + i * reference.dt
        sample = telemetry(i)
        expected = reference.step(stamp, sample).output
        out = harness.send_and_wait(stamp, to_msg(stamp, sample, scrambled), proc)

        torques = out["/estimated_joint_torques"]
        assert list(torques.name) == JOINTS
        np.testing.assert_allclose(torques.effort, expected.torque, atol=1e-5)
        _, rotation = chain.pose(sample["position"])
        if wrench_frame == "end_effector":
            frame, force, raw = ROBOT.tf_frames["end_effector"], rotation.T @ expected.force, rotation.T @ expected.force_raw
        else:
            frame, force, raw = ROBOT.force_frame, expected.force, expected.force_raw
        wrench = out["/external_wrench"]
        assert wrench.header.frame_id == frame
        f = wrench.wrench.force
        np.testing.assert_allclose([f.x, f.y, f.z], force, atol=1e-5)
        estimate = out["/external_force"]
        assert estimate.header.frame_id == frame
        np.testing.assert_allclose([estimate.force_raw.x, estimate.force_raw.y, estimate.force_raw.z], raw, rtol=1e-4,
                                   atol=1e-5)
        assert estimate.contact_probability == pytest.approx(expected.contact_probability, abs=1e-6)
        assert estimate.in_contact == (expected.contact_probability > 0.3)
        condition = out["/motor_condition"]
        np.testing.assert_allclose(condition.score, expected.condition, atol=1e-6)
        assert list(condition.degraded) == [bool(s < 0.5) for s in expected.condition]
        marker = out["/external_wrench_marker"]
        assert marker.type == Marker.ARROW and marker.header.frame_id == ROBOT.tf_frames["end_effector"]
        tip = marker.points[1]
        np.testing.assert_allclose([tip.x, tip.y, tip.z], rotation.T @ expected.force / 20.0, atol=1e-6)
    # a report published after the last output (an earlier one may predate it on a loaded machine)
    status = harness.wait_status(": input", OK, "model", proc)
    values = {kv.key: kv.value for kv in status.values}
    assert int(values["outputs_total"]) >= 20
    harness.wait_status(": model", OK, "model loaded", proc, timeout=2.0)
    assert proc.poll() is None


BAD_INPUTS = {
    # case: (make the bad message from the next step index, expected level, expected text)
    "nan": (lambda i, stamp: _with(telemetry(i), "position", 2, np.nan, stamp), WARN, "non-finite position at elbow_flex"),
    "inf": (lambda i, stamp: _with(telemetry(i), "load", 0, np.inf, stamp), WARN, "non-finite load at shoulder_pan"),
    "missing_joints": (lambda i, stamp: to_msg(stamp, telemetry(i), JOINTS[:-1]), ERROR,
                       "joints missing from the message: gripper"),
    "gap": (lambda i, stamp: to_msg(stamp + 2.0, telemetry(i)), WARN, "history reset: gap of"),
    "out_of_order": (lambda i, stamp: to_msg(stamp - 3.5 * 0.01605, telemetry(i)), WARN, "out-of-order stamps"),
}


def _with(sample, quantity, joint, value, stamp) -> ActuatorState:
    sample[quantity][joint] = value
    return to_msg(stamp, sample)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_reported_and_the_node_keeps_running(processes, harness, model_path, case):
    make_bad, level, text = BAD_INPUTS[case]
    proc = start_node(processes, model_path)
    harness.wait_connected(proc)
    dt = ROBOT.data_dt
    for i in range(10):
        harness.send_and_wait(T0 + i * dt, to_msg(T0 + i * dt, telemetry(i)), proc)
    harness.pub.publish(make_bad(10, T0 + 10 * dt))
    harness.wait_status(": input", level, text, proc)
    # still alive and still estimating
    resume = T0 + (2.0 if case == "gap" else 0.0) + 11 * dt
    out = harness.send_and_wait(resume, to_msg(resume, telemetry(11)), proc)
    assert np.isfinite(out["/estimated_joint_torques"].effort).all()
    assert proc.poll() is None


def test_model_for_another_robot_is_an_error_diagnostic_not_a_crash(processes, harness):
    omx_model = contract_model("omx").path
    proc = start_node(processes, omx_model, robot="so101")
    harness.spin_until(lambda: harness.pub.get_subscription_count() > 0, 40.0, "the node's subscription", proc)
    harness.wait_status(": model", ERROR, "model is for robot omx, this node drives so101", proc, timeout=40.0)
    for i in range(5):
        harness.pub.publish(to_msg(T0 + i * ROBOT.data_dt, telemetry(i)))
        rclpy.spin_once(harness.node, timeout_sec=0.05)
    harness.wait_status(": model", ERROR, "model not loaded", proc)
    assert not any(harness.received.values()), "a node without a model must not publish estimates"
    assert proc.poll() is None


def test_parameters_are_declared_with_descriptions_and_ranges(model_path):
    from na_inference.node import InferenceNode

    rclpy.init()
    try:
        node = InferenceNode(parameter_overrides=[rclpy.parameter.Parameter("model_path", value=str(model_path))])
        names = ["robot", "model_path", "contact_threshold", "condition_threshold", "marker_scale", "wrench_frame",
                 "max_gap_dt", "stale_timeout", "diagnostics_period", "input_queue_depth", "intra_op_threads"]
        descriptors = node.describe_parameters(names)
        for name, descriptor in zip(names, descriptors):
            assert descriptor.description, name
        ranged = {d.name: d for d in descriptors if d.floating_point_range or d.integer_range}
        assert set(ranged) == set(names) - {"robot", "model_path", "wrench_frame"}
        assert ranged["contact_threshold"].floating_point_range[0].to_value == 1.0
        (result,) = node.set_parameters([rclpy.parameter.Parameter("contact_threshold", value=1.5)])
        assert not result.successful  # outside the declared range
        node.destroy_node()
    finally:
        rclpy.shutdown()


def test_omx_node_derives_the_gripper_aperture_and_keeps_the_models_force_frame(processes, harness):
    omx = load_robot("omx")
    omx_model = contract_model("omx").path
    proc = start_node(processes, omx_model, robot="omx")
    harness.wait_connected(proc)
    reference = InferenceEngine(omx_model, "omx")
    joints = list(omx.joint_names)
    for i in range(12):
        stamp = T0 + i * reference.dt
        phase = 0.05 * i + np.arange(len(joints))
        sample = {"position": 0.3 * np.sin(phase), "goal_position": 0.3 * np.sin(phase) + 0.01,
                  "velocity": 0.2 * np.cos(phase), "current": 0.1 * np.sin(phase), "load": 0.1 * np.cos(phase),
                  "voltage": np.full(len(joints), 12.0), "temperature": np.full(len(joints), 35.0)}
        msg = ActuatorState()
        msg.header.stamp.sec = int(stamp)
        msg.header.stamp.nanosec = round((stamp - int(stamp)) * 1e9)
        msg.name = joints
        for field, values in sample.items():
            setattr(msg, field, [float(v) for v in values])
        sample.update(derived_telemetry(omx, sample, ["aperture"]))
        expected = reference.step(stamp, sample).output
        out = harness.send_and_wait(stamp, msg, proc)
        np.testing.assert_allclose(out["/estimated_joint_torques"].effort, expected.torque, atol=1e-5)
        assert out["/external_wrench"].header.frame_id == omx.force_frame  # not the base: no rotation
    harness.wait_status(": frames", WARN, "wrench and marker stay in the model's frame", proc)
    assert proc.poll() is None
