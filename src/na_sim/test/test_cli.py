"""The console commands as users run them: na-sim-bus with the real servo SDKs, na-sim-dataset."""

import json
import math
import shutil
import subprocess
import sys

import pytest
from na_testing import NA_SIM_DATASET, wait_until

from na_description.robot_table import load_robot

BUS = [sys.executable, "-c", "from na_sim.cli import bus_main; raise SystemExit(bus_main())"]


def first_line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    lines: list[str] = []
    wait_until(lambda: lines.append(proc.stdout.readline()) or lines[-1], timeout, what="the device path")
    return lines[-1].strip()


def test_so101_bus_moves_the_simulated_arm_through_scservo_sdk(processes, tmp_path):
    import scservo_sdk as scs

    robot = load_robot("so101")
    link = tmp_path / "ttySO101"
    proc = processes.start([*BUS, "--robot", "so101", "--link", str(link), "--scenario", "idle"])
    assert first_line(proc) == str(link)
    port = scs.PortHandler(str(link))
    assert port.openPort() and port.setBaudRate(robot.bus.baudrate)
    packets = scs.PacketHandler(robot.bus.extra.get("protocol_end", 0))
    reg = robot.bus.register
    try:
        model, result, _ = packets.ping(port, 2)
        assert result == scs.COMM_SUCCESS and model == robot.bus.model_number
        # Torque on, then command shoulder_pan +0.3 rad from where it is.
        assert packets.write1ByteTxRx(port, 1, reg("torque_enable").address, 1)[0] == scs.COMM_SUCCESS
        raw, result, _ = packets.read2ByteTxRx(port, 1, reg("present_position").address)
        assert result == scs.COMM_SUCCESS
        goal = raw + round(0.3 * 4096 / (2 * math.pi))
        assert packets.write2ByteTxRx(port, 1, reg("goal_position").address, goal)[0] == scs.COMM_SUCCESS

        def reached() -> bool:
            now, res, _ = packets.read2ByteTxRx(port, 1, reg("present_position").address)
            return res == scs.COMM_SUCCESS and abs(now - goal) <= 15
        wait_until(reached, 10.0, interval=0.05, what="shoulder_pan to reach its goal")
    finally:
        port.closePort()
    assert processes.stop(proc) == 0


def test_omx_bus_answers_dynamixel_sdk_sync_read(processes):
    import dynamixel_sdk as dxl

    robot = load_robot("omx")
    proc = processes.start([*BUS, "--robot", "omx", "--scenario", "go_up_and_stay"])
    path = first_line(proc)
    port = dxl.PortHandler(path)
    assert port.openPort() and port.setBaudRate(robot.bus.baudrate)
    packets = dxl.PacketHandler(2.0)
    start, length = robot.bus.telemetry_start, robot.bus.telemetry_length
    reader = dxl.GroupSyncRead(port, packets, start, length)
    try:
        for servo in robot.bus.ids:
            assert reader.addParam(servo)
        assert reader.txRxPacket() == dxl.COMM_SUCCESS
        volts = reader.getData(robot.bus.ids[0], robot.bus.register("present_input_voltage").address, 2)
        assert 100 <= volts <= 130                     # 0.1 V counts around the 12 V supply
    finally:
        port.closePort()
    assert processes.stop(proc) == 0


def test_panda_streams_joint_states_and_torques(processes):
    proc = processes.start([*BUS, "--robot", "panda"])
    assert "no servo bus" in first_line(proc)
    line = json.loads(first_line(proc))
    assert len(line["position"]) == 7 and len(line["effort"]) == 7
    assert max(abs(v) for v in line["effort"]) > 1.0   # holding the arm against gravity
    assert processes.stop(proc) == 0


def test_bus_rejects_bad_arguments():
    result = subprocess.run([*BUS, "--robot", "so101", "--faults", "drop=2"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "--faults" in result.stderr


def test_dataset_command_writes_nad_episodes(tmp_path):
    out = tmp_path / "synthetic"
    result = subprocess.run([*NA_SIM_DATASET, "--robot", "so101", "--episodes", "2", "--seed", "3", "--out", str(out),
                             "--scenarios", "idle,push", "--duration", "2", "--no-progress"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrote 2 episodes" in result.stdout and "x real time" in result.stdout
    files = sorted(out.rglob("*.csv"))
    assert [f.parent.parent.name for f in files] == ["idle", "push"]
    bad = subprocess.run([*NA_SIM_DATASET, "--episodes", "1", "--out", str(out), "--scenarios", "juggle"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "juggle" in bad.stderr


@pytest.mark.skipif(shutil.which("na-sim-dataset") is None, reason="console scripts not installed")
def test_console_script_help():
    assert "NAD" in subprocess.run(["na-sim-dataset", "--help"], capture_output=True, text=True, timeout=60).stdout
