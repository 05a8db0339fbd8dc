"""NAD loader/writer: real files from ../shared/nad, unit conversion against the raw CSV, exact round trips."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from na_inference.nad import (
    NADFormatError,
    Trajectory,
    describe_path,
    find_trajectories,
    format_trajectory,
    holdout_split,
    load_trajectory,
    write_trajectory,
)

SO101_FILE = Path("so101/pick_and_place/300g/train/001.csv")
OMX_FILE = Path("force_sensor/force_x_plus/train/001.csv")
DEGRADE_FILE = Path("motor_condition/pick_place_empty_degrade/train/001.csv")


def raw_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


def test_so101_units_against_raw_csv(nad_dir: Path) -> None:
    path = nad_dir / SO101_FILE
    traj = load_trajectory(path)
    header, rows = raw_rows(path)
    assert traj.robot == "so101" and traj.task == "pick_and_place" and traj.payload_kg == pytest.approx(0.3)
    assert traj.split == "train" and traj.condition is None
    assert len(traj) == len(rows)
    col = {name: i for i, name in enumerate(header)}
    for i in (0, len(rows) // 2, len(rows) - 1):
        row = rows[i]
        assert traj.time[i] == float(row[col["timestamp"]])
        for j in range(6):
            n = j + 1
            assert traj.quantities["position"][i, j] == float(row[col[f"pos{n}"]])
            assert traj.quantities["goal_position"][i, j] == float(row[col[f"goal_pos{n}"]])
            assert traj.quantities["velocity"][i, j] == pytest.approx(int(row[col[f"vel{n}"]]) * 2 * math.pi / 4096)
            assert traj.quantities["load"][i, j] == pytest.approx(int(row[col[f"load{n}"]]) / 1000)
            assert traj.quantities["current"][i, j] == pytest.approx(int(row[col[f"current{n}"]]) * 0.0065)
            assert traj.quantities["voltage"][i, j] == pytest.approx(int(row[col[f"volts{n}"]]) / 10)
            assert traj.quantities["temperature"][i, j] == float(row[col[f"temp{n}"]])
        for axis, name in enumerate(("force_x", "force_y", "force_z")):
            raw = float(row[col[name]])
            got = traj.force[i, axis]
            assert np.isnan(got) if raw == -999 else got == raw
    # Payload held at some point: z labelled with -m*g, x/y never labelled.
    assert np.nanmin(traj.force[:, 2]) == pytest.approx(-0.3 * 9.81, abs=0.01)
    assert np.all(np.isnan(traj.force[:, :2]))
    assert 0 < traj.force_labelled.sum() < len(traj)


def test_omx_units_and_condition(nad_dir: Path) -> None:
    traj = load_trajectory(nad_dir / OMX_FILE)
    header, rows = raw_rows(nad_dir / OMX_FILE)
    col = {name: i for i, name in enumerate(header)}
    assert traj.robot == "omx" and traj.task == "force_x_plus" and traj.category == "force_sensor"
    assert traj.condition is None and not np.isnan(traj.force).any()
    row = rows[10]
    assert traj.quantities["current"][10, 2] == pytest.approx(float(row[col["current3"]]) / 1000)
    assert traj.quantities["load"][10, 1] == pytest.approx(int(row[col["pwm2"]]) / 885)
    assert traj.quantities["velocity"][10, 0] == float(row[col["vel1"]])
    assert traj.quantities["voltage"][10, 0] == float(row[col["volts1"]])
    assert traj.quantities["aperture"].shape == (len(rows),)
    assert traj.force[10, 0] == float(row[col["force_x"]])
    degraded = load_trajectory(nad_dir / DEGRADE_FILE)
    np.testing.assert_array_equal(degraded.condition, [1, 1, 0, 1, 1])
    assert np.isnan(degraded.force).all()  # -999 everywhere: no force label in this task


def test_so101_write_is_byte_identical(nad_dir: Path, tmp_path: Path) -> None:
    for rel in (SO101_FILE, Path("so101/go_up_and_stay_still/500g/train/002.csv")):
        source = nad_dir / rel
        out = tmp_path / rel.name
        write_trajectory(out, load_trajectory(source))
        assert out.read_bytes() == source.read_bytes()


def test_omx_round_trip(nad_dir: Path, tmp_path: Path) -> None:
    for rel in (OMX_FILE, DEGRADE_FILE):
        original = load_trajectory(nad_dir / rel)
        first = tmp_path / "first.csv"
        write_trajectory(first, original)
        again = load_trajectory(first, robot="omx")
        for name, values in original.quantities.items():
            np.testing.assert_allclose(again.quantities[name], values, rtol=1e-12, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(again.force, original.force)
        second = tmp_path / "second.csv"
        write_trajectory(second, again)
        assert second.read_bytes() == first.read_bytes()
        text = first.read_bytes()
        assert text.count(b"\r\n") == len(original) + 1 and b"\n" not in text.replace(b"\r\n", b"")


def synthetic_so101(rows: int = 20) -> Trajectory:
    rng = np.random.default_rng(0)
    q = {
        "position": rng.uniform(-1, 1, (rows, 6)),
        "goal_position": rng.uniform(-1, 1, (rows, 6)),
        "velocity": rng.integers(-300, 300, (rows, 6)) * 2 * math.pi / 4096 + 1e-4,  # off-grid: rounds
        "load": rng.integers(-1000, 1000, (rows, 6)) / 1000,
        "current": rng.integers(0, 300, (rows, 6)) * 0.0065,
        "voltage": np.full((rows, 6), 12.2),
        "temperature": np.full((rows, 6), 35.0),
    }
    force = np.full((rows, 3), np.nan)
    force[5:9, 2] = -2.94
    return Trajectory("so101", None, "synthetic", 0.3, np.arange(rows) * 0.01605, q, force)


def test_round_trip_synthetic_rounds_to_registers(tmp_path: Path) -> None:
    traj = synthetic_so101()
    path = tmp_path / "so101" / "pick_and_place" / "300g" / "test" / "004.csv"
    write_trajectory(path, traj)
    back = load_trajectory(path)
    assert (back.task, back.payload_kg, back.split) == ("pick_and_place", 0.3, "test")
    for name in ("position", "goal_position", "load", "current", "voltage", "temperature"):
        np.testing.assert_allclose(back.quantities[name], traj.quantities[name], atol=1e-12, err_msg=name)
    np.testing.assert_allclose(back.quantities["velocity"], traj.quantities["velocity"] - 1e-4, atol=1e-12)
    np.testing.assert_array_equal(back.force, traj.force)
    lines = path.read_bytes().split(b"\r\n")
    assert lines[0].startswith(b"timestamp,pos1,") and lines[0].endswith(b"force_x,force_y,force_z")
    assert lines[1].endswith(b"-999,-999,-999") and lines[6].endswith(b"-999,-999,-2.94")


def test_bad_input_gives_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="NAD file not found"):
        load_trajectory(tmp_path / "missing.csv")
    bad_header = tmp_path / "bad.csv"
    bad_header.write_text("time,a,b\r\n1,2,3\r\n")
    with pytest.raises(NADFormatError, match="unknown NAD header"):
        load_trajectory(bad_header)
    good = tmp_path / "good.csv"
    write_trajectory(good, synthetic_so101(5))
    lines = good.read_text().splitlines()
    short = tmp_path / "short.csv"
    short.write_text("\n".join([*lines[:3], lines[3].rsplit(",", 2)[0]]) + "\n")  # LF endings are accepted too
    with pytest.raises(NADFormatError, match=r"short.csv:4: row has 44 fields, header has 46"):
        load_trajectory(short)
    text_cell = tmp_path / "text.csv"
    text_cell.write_text("\r\n".join([lines[0], lines[1].replace(",", ",abc,", 1).replace(",", "", 1)]))
    with pytest.raises(NADFormatError, match="not a number"):
        load_trajectory(text_cell)
    with pytest.raises(NADFormatError, match="not the omx NAD schema"):
        load_trajectory(good, robot="omx")
    nan_traj = synthetic_so101(5)
    nan_traj.quantities["current"][2, 1] = np.nan
    target = tmp_path / "nan.csv"
    with pytest.raises(NADFormatError, match="NaN in column current2"):
        write_trajectory(target, nan_traj)
    assert not target.exists() and not list(tmp_path.glob(".nan.csv*"))


def test_find_and_split(nad_dir: Path, tmp_path: Path) -> None:
    files = find_trajectories(nad_dir, "so101")
    assert len(files) == 18
    train, val = holdout_split(files)
    assert len(train) == 12 and len(val) == 6 and all(p.name == "003.csv" for p in val)
    train0, val0 = holdout_split(files, fold=0)
    assert [p.name for p in val0] == ["001.csv"] * 6 and sorted(train0 + val0) == files
    assert not set(train0) & set(val0)
    with pytest.raises(ValueError, match="holdout fold 3 needs 4 files per task"):
        holdout_split(files, fold=3)
    assert len(find_trajectories(nad_dir, "omx")) == 7
    with pytest.raises(FileNotFoundError, match="no so101 NAD files"):
        find_trajectories(tmp_path, "so101")
    # Full release layout: <root>/data/...
    release = tmp_path / "release" / "data" / "so101" / "pick_and_place" / "400g" / "validation"
    write_trajectory(release / "009.csv", synthetic_so101(3))
    assert find_trajectories(tmp_path / "release", "so101", split="validation") == [release / "009.csv"]
    franka = describe_path(Path("data/franka/lift_hold/train/400_003.csv"), "panda")
    assert franka == {"task": "lift_hold", "payload_kg": 0.4, "split": "train", "category": "franka"}


def test_format_rejects_wrong_width() -> None:
    traj = synthetic_so101(3)
    traj.quantities["load"] = traj.quantities["load"][:, :5]
    with pytest.raises(NADFormatError, match="'load' has 5 columns"):
        format_trajectory(traj)


def test_panda_schema_round_trip(tmp_path: Path) -> None:
    rows = 6
    rng = np.random.default_rng(3)
    names = ("position", "velocity", "velocity_desired", "torque_desired", "torque", "torque_external",
             "goal_position", "motor_position", "motor_velocity")
    quantities = {name: rng.normal(size=(rows, 7)) for name in names}
    quantities.update(gripper_width=rng.uniform(0, 1, rows), wrench_torque=rng.normal(size=(rows, 3)),
                      lifting=np.array([0, 0, 1, 1, 1, 0.0]))
    force = np.full((rows, 3), np.nan)
    force[2:5] = [0.0, 0.0, -3.92]
    traj = Trajectory("panda", None, "lift_hold", 0.4, np.arange(rows) * 0.016, quantities, force)
    path = tmp_path / "data" / "franka" / "lift_hold" / "train" / "400_003.csv"
    write_trajectory(path, traj)
    header = path.read_text().splitlines()[0].split(",")
    assert len(header) == 72 and header[-1] == "lifting"
    back = load_trajectory(path)  # robot detected from the 72-column header
    assert (back.robot, back.task, back.payload_kg) == ("panda", "lift_hold", 0.4)
    for name, values in quantities.items():
        np.testing.assert_array_equal(back.quantities[name], values, err_msg=name)
    np.testing.assert_array_equal(back.force, force)
    assert find_trajectories(tmp_path, "panda") == [path]


def test_robot_folder_as_root_and_cli(nad_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert len(find_trajectories(nad_dir / "so101", "so101")) == 18
    from na_inference.nad import main

    assert main([str(nad_dir), "--robot", "omx", "--split", "all"]) == 0
    out = capsys.readouterr().out
    assert "pick_place_empty_degrade" in out and "7 files" in out
    assert main([str(nad_dir / "nowhere"), "--robot", "so101"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_lf_line_endings_and_bom_read_the_same(nad_dir: Path, tmp_path: Path) -> None:
    source = nad_dir / SO101_FILE
    lf = tmp_path / "lf.csv"
    lf.write_bytes(b"\xef\xbb\xbf" + source.read_bytes().replace(b"\r\n", b"\n"))
    a, b = load_trajectory(source), load_trajectory(lf)
    assert b.robot == "so101"
    for name in a.quantities:
        np.testing.assert_array_equal(a.quantities[name], b.quantities[name])
    np.testing.assert_array_equal(a.force, b.force)
