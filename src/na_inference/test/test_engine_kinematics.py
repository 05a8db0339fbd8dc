"""The numpy URDF forward kinematics the node uses for the end-effector frame, against MuJoCo's MJCF."""

from __future__ import annotations

import numpy as np
import pytest

from na_description.robot_table import load_robot
from na_inference.kinematics import KinematicsError, SerialChain, matrix_to_quat, rpy_to_matrix


def test_so101_tip_matches_the_mjcf_grasp_site_for_random_poses():
    mujoco = pytest.importorskip("mujoco")
    robot = load_robot("so101")
    chain = SerialChain.from_robot(robot)
    assert (chain.base, chain.tip) == (robot.tf_frames["base"], robot.tf_frames["end_effector"])
    model = mujoco.MjModel.from_xml_path(str(robot.description_path("mjcf")))
    data = mujoco.MjData(model)
    base, site = model.body(robot.frames["base"]).id, model.site(robot.frames["grasp_site"]).id
    rng = np.random.default_rng(3)
    offsets = []
    for _ in range(20):
        q = rng.uniform(robot.position_min, robot.position_max)
        for i, name in enumerate(robot.joint_names):
            data.qpos[model.joint(name).qposadr[0]] = q[i]
        mujoco.mj_kinematics(model, data)
        base_rot = data.xmat[base].reshape(3, 3)
        expected_pos = base_rot.T @ (data.site_xpos[site] - data.xpos[base])
        expected_rot = base_rot.T @ data.site_xmat[site].reshape(3, 3)
        pos, rot = chain.pose(q)
        # two independent descriptions (URDF vs MJCF) of the same arm: positions agree to the files' rounding
        np.testing.assert_allclose(pos, expected_pos, atol=1e-5)
        offsets.append(rot.T @ expected_rot)
    # the frames differ only by a fixed convention rotation, the same in every pose
    np.testing.assert_allclose(np.array(offsets) - offsets[0], 0.0, atol=1e-4)  # URDF rpy 1.5708 ~ pi/2
    np.testing.assert_allclose(offsets[0] @ offsets[0].T, np.eye(3), atol=1e-9)


def test_rotation_helpers_round_trip():
    rot = rpy_to_matrix(0.3, -1.1, 2.0)
    np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-12)
    x, y, z, w = matrix_to_quat(rot)
    rebuilt = np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])
    np.testing.assert_allclose(rebuilt, rot, atol=1e-12)


def test_unknown_link_is_a_clear_error():
    robot = load_robot("so101")
    with pytest.raises(KinematicsError, match="no link 'nowhere'"):
        SerialChain.from_urdf(robot.description_path("urdf"), list(robot.joint_names), "base_link", "nowhere")
