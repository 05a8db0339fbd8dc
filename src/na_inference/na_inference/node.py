"""``inference_node``: the ROS 2 shell around the inference engine (numpy + onnxruntime, never torch).

Subscribes ``/actuator_states`` (na_msgs/ActuatorState, sensor-data QoS) and, for every sample that
completes a model step (see ``engine``: faster telemetry is decimated onto the model's dt grid,
slower telemetry resampled), publishes with the input sample's header stamp:

* ``/estimated_joint_torques`` sensor_msgs/JointState (effort, N.m)
* ``/external_wrench`` geometry_msgs/WrenchStamped (gated force, N; torque zero)
* ``/external_force`` na_msgs/ExternalForceEstimate (gated and raw force, contact probability)
* ``/motor_condition`` na_msgs/MotorCondition
* ``/external_wrench_marker`` visualization_msgs/Marker (arrow at the end effector, |F| / marker_scale m)

and ``/diagnostics`` every ``diagnostics_period`` s. A model that is missing, corrupt or made for
another robot is reported as an ERROR diagnostic; the node keeps running and publishes no estimates.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import Point, WrenchStamped
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import JointState
from visualization_msgs.msg import Marker

from na_description.robot_table import RobotTable, RobotTableError, load_robot
from na_inference.contract import ModelContractError
from na_inference.engine import (
    EngineOutput,
    InferenceEngine,
    JointMismatchError,
    SampleStatus,
    derived_telemetry,
    resolve_model_path,
    select_joints,
)
from na_inference.kinematics import KinematicsError, SerialChain
from na_inference.monitor import RuntimeMonitor, Status
from na_msgs.msg import ActuatorState, ExternalForceEstimate, MotorCondition

NODE_NAME = "inference_node"
WRENCH_FRAMES = ("base", "end_effector")
# ActuatorState fields, by the feature pipeline's quantity names.
MESSAGE_FIELDS = ("position", "velocity", "goal_position", "current", "load", "voltage", "temperature")


def _float_param(description: str, low: float, high: float, step: float = 0.0) -> ParameterDescriptor:
    return ParameterDescriptor(description=description,
                               floating_point_range=[FloatingPointRange(from_value=low, to_value=high, step=step)])


def _qos_fields(profile: QoSProfile) -> dict:
    return {"history": profile.history, "reliability": profile.reliability, "durability": profile.durability}


def _stamp_seconds(msg: ActuatorState) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


class InferenceNode(Node):
    """Thin ROS shell: parameters, topics and diagnostics around ``InferenceEngine``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.declare_parameter("robot", "so101", ParameterDescriptor(
            description="robot table name (so101, omx, panda): joint names, frames, default model file"))
        self.declare_parameter("model_path", "", ParameterDescriptor(
            description="ONNX model file; empty = the robot table's model.file, looked up in the source "
                        "checkout, then in <prefix>/share/na_inference/ of AMENT_PREFIX_PATH"))
        self.declare_parameter("contact_threshold", 0.5, _float_param(
            "contact probability above which /external_force in_contact is true", 0.0, 1.0))
        self.declare_parameter("condition_threshold", 0.5, _float_param(
            "motor condition score below which a joint is reported degraded", 0.0, 1.0))
        self.declare_parameter("marker_scale", 20.0, _float_param(
            "force arrow scale in N per metre of arrow length", 0.1, 10000.0))
        self.declare_parameter("wrench_frame", "base", ParameterDescriptor(
            description="frame of /external_wrench and /external_force: 'base' (the model's force frame) "
                        "or 'end_effector' (rotated through forward kinematics of the sample's joint angles)"))
        self.declare_parameter("max_gap_dt", 5.0, _float_param(
            "telemetry gap, in model steps, after which the history is reset", 1.0, 1000.0))
        self.declare_parameter("stale_timeout", 0.5, _float_param(
            "seconds without telemetry after which diagnostics report the input stale", 0.01, 60.0))
        self.declare_parameter("diagnostics_period", 1.0, _float_param(
            "seconds between /diagnostics reports", 0.05, 60.0))
        self.declare_parameter("input_queue_depth", 100, ParameterDescriptor(
            description="/actuator_states subscription depth (sensor-data QoS, best effort): samples buffered "
                        "while the process is not scheduled; 100 = 100 ms at 1 kHz",
            integer_range=[IntegerRange(from_value=1, to_value=1000, step=1)]))
        self.declare_parameter("intra_op_threads", 1, ParameterDescriptor(
            description="ONNX Runtime intra-op threads (1 = lowest latency on a shared CPU)",
            integer_range=[IntegerRange(from_value=1, to_value=64, step=1)]))
        self.declare_parameter("payload_observer", True, ParameterDescriptor(
            description="while the gripper carries a lifted object, publish its weight from the physics of the "
                        "arm's motion (the robot table's payload_observer; the network's estimate is its prior) "
                        "instead of the network's force alone; off where the table has none"))

        param = self.get_parameter
        self.contact_threshold = float(param("contact_threshold").value)
        self.condition_threshold = float(param("condition_threshold").value)
        self.marker_scale = float(param("marker_scale").value)
        robot_name = str(param("robot").value)
        try:
            self.robot: RobotTable | None = load_robot(robot_name)
        except RobotTableError as exc:
            self.robot = None
            self.get_logger().error(str(exc))
        joint_names = self.robot.joint_names if self.robot else ()
        self.monitor = RuntimeMonitor(NODE_NAME, joint_names, self.robot.data_dt if self.robot else None,
                                      self.condition_threshold, float(param("stale_timeout").value))
        self.engine: InferenceEngine | None = None
        self.chain: SerialChain | None = None
        self.force_frame = ""
        self.tip_frame = ""
        self._frame_problem = ""
        if self.robot is not None:
            self._load_model(param("model_path").value, float(param("max_gap_dt").value),
                             int(param("intra_op_threads").value), bool(param("payload_observer").value))
            self._setup_frames(str(param("wrench_frame").value))
        else:
            self.monitor.model_failed("", f"unknown robot {robot_name!r}")
        self._name_cache: tuple[tuple[str, ...], bool] | None = None
        if self.engine is not None:
            self._make_messages()
            self._message_quantities = [q for q in self.engine.quantities if q in MESSAGE_FIELDS]
            self._derived_quantities = [q for q in self.engine.quantities if q not in MESSAGE_FIELDS]

        self.torque_pub = self.create_publisher(JointState, "estimated_joint_torques", qos_profile_sensor_data)
        self.wrench_pub = self.create_publisher(WrenchStamped, "external_wrench", qos_profile_sensor_data)
        self.force_pub = self.create_publisher(ExternalForceEstimate, "external_force", qos_profile_sensor_data)
        self.condition_pub = self.create_publisher(MotorCondition, "motor_condition", qos_profile_sensor_data)
        self.marker_pub = self.create_publisher(Marker, "external_wrench_marker", qos_profile_sensor_data)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        input_qos = QoSProfile(**{**_qos_fields(qos_profile_sensor_data), "depth": int(param("input_queue_depth").value)})
        self.create_subscription(ActuatorState, "actuator_states", self._on_actuator_state, input_qos)
        self.create_timer(float(param("diagnostics_period").value), self._publish_diagnostics)

    # ------------------------------------------------------------------ start-up

    def _load_model(self, override: str, max_gap_dt: float, threads: int, payload_observer: bool) -> None:
        path = resolve_model_path(self.robot, override or None)
        try:
            self.engine = InferenceEngine(path, self.robot, max_gap_dt=max_gap_dt, threads=threads,
                                          payload_observer=payload_observer)
        except ModelContractError as exc:
            self.get_logger().error(f"model not loaded: {exc}")
            self.monitor.model_failed(str(path), str(exc))
            return
        meta = self.engine.metadata
        self.force_frame = meta.force_frame
        self.monitor.model_loaded(str(path), {
            "path": str(path), "robot": meta.robot, "joints": ",".join(meta.joint_names),
            "history": str(meta.history), "dt_s": str(self.engine.dt),
            "features": str(self.engine.spec.n_features), "force_frame": meta.force_frame,
            "payload_observer": self.engine.payload_observer_status})
        self.get_logger().info(f"model {path} loaded: {meta.robot}, history {meta.history}, dt {self.engine.dt} s; "
                               f"payload observer {self.engine.payload_observer_status}")

    def _setup_frames(self, wrench_frame: str) -> None:
        """Forward kinematics for the end-effector frame (wrench option and marker placement)."""
        if wrench_frame not in WRENCH_FRAMES:
            self._frame_problem = f"wrench_frame {wrench_frame!r} is not one of {WRENCH_FRAMES}; using base"
            wrench_frame = "base"
        self.express_in_tip = wrench_frame == "end_effector"
        if self.engine is None:
            return
        base = self.robot.tf_frames.get("base", "")
        if self.force_frame == base:
            try:
                self.chain = SerialChain.from_robot(self.robot)
                self.tip_frame = self.chain.tip
            except (KinematicsError, RobotTableError) as exc:
                self._frame_problem = f"no forward kinematics ({exc}); wrench stays in {self.force_frame}"
        else:
            self._frame_problem = (f"model force frame {self.force_frame!r} is not the base {base!r}: "
                                   "wrench and marker stay in the model's frame")
        if self.chain is None:
            self.express_in_tip = False
        if self._frame_problem:
            self.get_logger().warning(self._frame_problem)

    # ------------------------------------------------------------------ per sample

    def _sample(self, msg: ActuatorState) -> dict[str, np.ndarray]:
        """The message's arrays by quantity, in the model's joint order, plus the quantities derived from
        them (``derived_telemetry``: e.g. the OMX gripper aperture)."""
        names = tuple(msg.name)
        if self._name_cache is None or self._name_cache[0] != names:
            self._name_cache = (names, names == self.engine.joint_names)
        if self._name_cache[1]:  # already in model order: no reordering copy
            sample = {}
            n = len(names)
            for quantity in self._message_quantities:
                values = np.frombuffer(getattr(msg, quantity), dtype=np.float64)
                if values.shape != (n,):
                    raise JointMismatchError(f"{quantity} has {values.size} values for {n} joint names")
                sample[quantity] = values
        else:
            arrays = {q: getattr(msg, q) for q in self._message_quantities}
            sample = select_joints(names, arrays, self.engine.joint_names, self._message_quantities)
        if self._derived_quantities:
            sample.update(derived_telemetry(self.robot, sample, self._derived_quantities))
        return sample

    def _on_actuator_state(self, msg: ActuatorState) -> None:
        received = time.monotonic()
        if self.engine is None:
            self.monitor.record_ignored(received)
            return
        try:
            sample = self._sample(msg)
        except JointMismatchError as exc:
            self.monitor.record_rejected(received, SampleStatus.MISSING_JOINTS, str(exc))
            return
        stamp = _stamp_seconds(msg)
        self.monitor.input_delay.add(time.time() - stamp)
        try:
            result = self.engine.step(stamp, sample)
            if result.output is not None:
                self._publish(msg, sample, result.output)
        except Exception as exc:  # a bug must not take the node down: report it and keep running
            self.get_logger().error(f"internal error on a sample: {exc!r}", throttle_duration_sec=5.0)
            self.monitor.record_internal_error(received, repr(exc))
            return
        self.monitor.record(received, stamp, result)
        if result.status is SampleStatus.INFERRED:
            self.monitor.callback_latency.add(time.monotonic() - received)

    def _make_messages(self) -> None:
        """Output messages built once and refilled per estimate (publish serializes at once, so reuse is
        safe): message construction in Python costs more than the small model's inference."""
        joint_names = list(self.engine.joint_names)
        self._wrench = WrenchStamped()
        self._estimate = ExternalForceEstimate()
        self._torques = JointState()
        self._torques.name = joint_names
        self._condition = MotorCondition()
        self._condition.name = joint_names
        marker = Marker()
        marker.ns, marker.id = "external_wrench", 0
        marker.type, marker.action = Marker.ARROW, Marker.ADD
        marker.header.frame_id = self.tip_frame if self.chain is not None else self.force_frame
        marker.pose.orientation.w = 1.0
        marker.scale.x, marker.scale.y, marker.scale.z = 0.01, 0.02, 0.02  # shaft, head diameters, head length
        marker.color.r, marker.color.g, marker.color.b = 1.0, 0.2, 0.1
        marker.points = [Point(), Point()]
        self._marker = marker

    def _publish(self, msg: ActuatorState, sample: dict[str, np.ndarray], out: EngineOutput) -> None:
        """All outputs of one estimate, the wrench first (what other stacks wait for)."""
        stamp = msg.header.stamp
        rotation = None
        if self.express_in_tip:
            _, rotation = self.chain.pose(sample["position"])
            force, force_raw, frame = rotation.T @ out.force, rotation.T @ out.force_raw, self.tip_frame
        else:
            force, force_raw, frame = out.force, out.force_raw, self.force_frame

        wrench = self._wrench
        wrench.header.stamp, wrench.header.frame_id = stamp, frame
        f = wrench.wrench.force
        f.x, f.y, f.z = float(force[0]), float(force[1]), float(force[2])
        self.wrench_pub.publish(wrench)

        estimate = self._estimate
        estimate.header.stamp, estimate.header.frame_id = stamp, frame
        estimate.force = f
        r = estimate.force_raw
        r.x, r.y, r.z = float(force_raw[0]), float(force_raw[1]), float(force_raw[2])
        estimate.contact_probability = out.contact_probability
        estimate.in_contact = out.contact_probability > self.contact_threshold
        self.force_pub.publish(estimate)

        torques = self._torques
        torques.header.stamp = stamp
        torques.effort = out.torque.tolist()
        self.torque_pub.publish(torques)

        condition = self._condition
        condition.header.stamp = stamp
        condition.score = out.condition.tolist()
        condition.degraded = (out.condition < self.condition_threshold).tolist()
        self.condition_pub.publish(condition)

        # arrow from the end-effector origin along the gated force, |F| / marker_scale metres long, drawn in
        # the tip frame so RViz places it at the end effector
        marker = self._marker
        marker.header.stamp = stamp
        vector = out.force
        if self.chain is not None:
            if rotation is None:
                _, rotation = self.chain.pose(sample["position"])
            vector = rotation.T @ out.force
        tip = marker.points[1]
        tip.x, tip.y, tip.z = (float(v) / self.marker_scale for v in vector)
        marker.color.a = float(max(0.2, out.contact_probability))
        self.marker_pub.publish(marker)

    # ------------------------------------------------------------------ diagnostics

    def _publish_diagnostics(self) -> None:
        statuses = self.monitor.report(time.monotonic())
        if self._frame_problem:
            statuses.append(Status(f"{NODE_NAME}: frames", 1, self._frame_problem))
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        array.status = [self._to_msg(status) for status in statuses]
        self.diagnostics_pub.publish(array)

    @staticmethod
    def _to_msg(status: Status) -> DiagnosticStatus:
        msg = DiagnosticStatus()
        msg.level = bytes([status.level])
        msg.name, msg.message, msg.hardware_id = status.name, status.message, NODE_NAME
        msg.values = [KeyValue(key=k, value=v) for k, v in status.values.items()]
        return msg


def make_executor() -> Executor:
    """rclpy's EventsExecutor where available (Jazzy: rclpy.experimental): at 1 kHz telemetry it costs
    ~11 % of a core per subscription here against ~29 % for the SingleThreadedExecutor, and drops
    nothing where the latter dropped ~2 % (measured with an empty callback, see README)."""
    try:
        from rclpy.experimental import EventsExecutor
    except ImportError:
        return SingleThreadedExecutor()
    return EventsExecutor()


def spin(node: Node) -> None:
    """Run ``node`` until shutdown (SIGINT/SIGTERM) with ``make_executor``."""
    executor = make_executor()
    executor.add_node(node)
    try:
        while rclpy.ok():
            executor.spin_once(timeout_sec=0.1)
    finally:
        executor.remove_node(node)
        executor.shutdown()


def main(args: Sequence[str] | None = None) -> None:
    rclpy.init(args=args)
    node = InferenceNode()
    try:
        spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
