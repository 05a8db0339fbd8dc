"""The robot tables load, agree with themselves, and point at description files that exist."""

import pytest

from na_description.robot_table import RobotTableError, load_robot, robot_names


def test_all_robots_listed():
    assert set(robot_names()) >= {"so101", "omx", "panda"}


@pytest.mark.parametrize("name", ["so101", "omx", "panda"])
def test_table_is_consistent(name):
    robot = load_robot(name)
    assert robot.n_joints == len(robot.position_min) == len(robot.position_max)
    assert all(lo < hi for lo, hi in zip(robot.position_min, robot.position_max))
    assert robot.data_dt > 0
    if robot.bus.ids:
        assert len(robot.bus.ids) == robot.n_joints
        start, length = robot.bus.telemetry_start, robot.bus.telemetry_length
        for reg in ("present_position", "present_velocity", "present_temperature"):
            r = robot.bus.register(reg)
            assert start <= r.address and r.address + r.size <= start + length


def test_so101_matches_feetech_datasheet():
    bus = load_robot("so101").bus
    assert bus.register("present_position").address == 56
    assert bus.register("present_current").address == 69
    assert bus.sign_bits["load"] == 10 and bus.sign_bits["position"] == 15


def test_unknown_robot_is_a_clear_error():
    with pytest.raises(RobotTableError, match="unknown robot"):
        load_robot("ur5")


def test_register_lookup_error_names_the_servo():
    with pytest.raises(RobotTableError, match="STS3215"):
        load_robot("so101").bus.register("goal_pwm")


@pytest.mark.parametrize("name,kind", [("so101", "mjcf"), ("so101", "urdf"), ("omx", "mjcf"), ("omx", "urdf"), ("panda", "urdf")])
def test_description_files_exist(name, kind):
    assert load_robot(name).description_path(kind).is_file()


@pytest.mark.parametrize("name,has_meshes", [("so101", True), ("omx", False), ("panda", True)])
def test_robot_description_has_absolute_mesh_paths(name, has_meshes):
    import re
    from pathlib import Path

    urdf = load_robot(name).robot_description()
    meshes = re.findall(r'filename="([^"]+)"', urdf)
    assert bool(meshes) == has_meshes  # the OMX description is built from primitives
    for uri in meshes:
        assert uri.startswith("file:///"), uri
        assert Path(uri[len("file://"):]).is_file(), uri


@pytest.mark.parametrize("kind", ["mjcf", "urdf"])
def test_omx_description_matches_its_table(kind):
    """The OMX description (written from ROBOTIS' published data) has the table's joints and arm limits."""
    mujoco = pytest.importorskip("mujoco")
    robot = load_robot("omx")
    model = mujoco.MjModel.from_xml_path(str(robot.description_path(kind)))
    assert {model.joint(i).name for i in range(model.njnt)} == set(robot.joint_names)
    for j, name in enumerate(robot.joint_names):
        if name == robot.gripper_joint:
            continue  # the table's gripper limits are ROBOTIS' prismatic jaw travel, the model's joint is the motor
        lo, hi = model.joint(name).range
        assert (lo, hi) == pytest.approx((robot.position_min[j], robot.position_max[j]), abs=1e-4)
    total = sum(model.body_mass)
    assert 0.5 < total < 0.7  # ROBOTIS link masses: ~0.61 kg without the base plate
