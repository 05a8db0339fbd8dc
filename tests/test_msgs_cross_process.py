"""Each na_msgs type published in one process arrives intact in another (real Fast DDS)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")
from rclpy.node import Node  # noqa: E402

from na_msgs.msg import ActuatorState, ExternalForceEstimate, MotorCondition  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from msg_publisher import sample  # noqa: E402

pytestmark = pytest.mark.ros


def _fields_equal(a, b) -> bool:
    for name in a.get_fields_and_field_types():
        va, vb = getattr(a, name), getattr(b, name)
        if hasattr(va, "get_fields_and_field_types"):
            if not _fields_equal(va, vb):
                return False
        elif isinstance(va, (list, tuple)) or hasattr(va, "tolist"):
            la, lb = list(va), list(vb)
            if len(la) != len(lb):
                return False
            for x, y in zip(la, lb):
                if isinstance(x, float) and math.isnan(x):
                    if not math.isnan(y):
                        return False
                elif x != y:
                    return False
        elif va != vb:
            return False
    return True


@pytest.mark.parametrize("msg_type", [ActuatorState, ExternalForceEstimate, MotorCondition])
def test_message_crosses_processes(msg_type, processes):
    kind = msg_type.__name__
    topic = f"/na_test/{kind.lower()}"
    publisher = processes.python([str(Path(__file__).parent / "msg_publisher.py"), kind, topic])
    rclpy.init()
    node = Node("na_msgs_test_subscriber")
    received: list = []
    node.create_subscription(msg_type, topic, received.append, 10)
    try:
        deadline = time.monotonic() + 30.0
        while not received and time.monotonic() < deadline:
            assert publisher.poll() is None, publisher.communicate()[0]
            rclpy.spin_once(node, timeout_sec=0.1)
        assert received, f"no {kind} received within 30 s"
        assert _fields_equal(received[0], sample(kind))
    finally:
        node.destroy_node()
        rclpy.shutdown()
    assert processes.stop(publisher) == 0
