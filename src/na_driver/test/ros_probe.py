"""A ROS 2 participant inside the test process: subscribes, publishes, and collects what arrives."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data


class RosProbe:
    """Own context + executor thread; ``received[topic]`` lists (arrival monotonic time, msg)."""

    def __init__(self, name: str = "na_driver_test_probe") -> None:
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = Node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.received: dict[str, list] = defaultdict(list)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._running = True
        self._thread.start()

    def _spin(self) -> None:
        while self._running and self.context.ok():
            self.executor.spin_once(timeout_sec=0.05)

    def subscribe(self, msg_type, topic: str, qos=qos_profile_sensor_data) -> None:
        def store(msg, topic=topic):
            with self._lock:
                self.received[topic].append((time.monotonic(), msg))
        self.node.create_subscription(msg_type, topic, store, qos)

    def publisher(self, msg_type, topic: str, qos=qos_profile_sensor_data):
        return self.node.create_publisher(msg_type, topic, qos)

    def messages(self, topic: str) -> list:
        with self._lock:
            return [m for _, m in self.received[topic]]

    def count(self, topic: str) -> int:
        with self._lock:
            return len(self.received[topic])

    def since(self, topic: str, t: float) -> list:
        with self._lock:
            return [m for ts, m in self.received[topic] if ts >= t]

    def close(self) -> None:
        self._running = False
        self._thread.join(timeout=2.0)
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


def wait_for(predicate, timeout: float, what: str, proc=None, interval: float = 0.02) -> None:
    """Poll ``predicate``; fail with ``what`` (and the helper process's output if it died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: helper process exited with {proc.returncode}:\n{proc.communicate()[0]}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
