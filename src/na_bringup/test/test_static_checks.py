"""Static checks of the bring-up that run without launch_ros (not on PyPI): every executable the stack
names is an installed console script, every file it names exists, every YAML parameter is declared by
its node, and each launch file brings up the stack it is named after."""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

from na_bringup.stack import STACKS, nodes_of, params_file, robot_of, share_dir
from na_description.robot_table import load_robot

PKG_ROOT = Path(__file__).resolve().parent.parent
SRC = PKG_ROOT.parent


def _console_scripts(package: str) -> set[str]:
    """console_scripts declared in the package's setup.py (read, not executed)."""
    tree = ast.parse((SRC / package / "setup.py").read_text())
    scripts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and " = " in node.value:
            scripts.add(node.value.split(" = ")[0].strip())
    return scripts


def _declared_parameters(module: str) -> set[str]:
    """Names passed to declare_parameter(name, ...) or to the drivers' declare(node, name, ...)."""
    source = Path(importlib.util.find_spec(module).origin).read_text()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        index = {"declare_parameter": 0, "declare": 1}.get(func)
        if index is not None and len(node.args) > index and isinstance(node.args[index], ast.Constant):
            names.add(node.args[index].value)
    return names


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_executables_are_installed_console_scripts(stack):
    for spec in nodes_of(stack):
        assert spec.executable in _console_scripts(spec.package), f"{spec.package} does not declare {spec.executable}"
        assert shutil.which(spec.executable), f"{spec.executable} is not installed on PATH"
    assert shutil.which("na-sim-bus") and "na-sim-bus" in _console_scripts("na_sim")


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_named_files_exist(stack):
    assert params_file(stack).is_file()
    assert (share_dir() / "rviz" / "neuralactuator.rviz").is_file()
    robot = load_robot(robot_of(stack))
    assert robot.description_path("urdf").is_file()
    assert "<robot" in robot.robot_description()


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_yaml_parameter_is_declared_by_its_node(stack):
    params = yaml.safe_load(params_file(stack).read_text())
    specs = {spec.name: spec for spec in nodes_of(stack)}
    assert set(params) == set(specs), f"YAML sections {set(params)} != stack nodes {set(specs)}"
    for name, section in params.items():
        declared = _declared_parameters(specs[name].factory.partition(":")[0])
        assert declared, f"no declared parameters found for {name}"
        undeclared = set(section["ros__parameters"]) - declared
        assert not undeclared, f"{stack}.yaml sets {sorted(undeclared)} that {name} does not declare"
        assert section["ros__parameters"].get("robot") == robot_of(stack)


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_launch_file_brings_up_its_stack(stack):
    tree = ast.parse((PKG_ROOT / "launch" / f"{stack}.launch.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "robot_launch_description"]
    assert len(calls) == 1 and calls[0].args[0].value == stack
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)


def test_launch_common_only_names_known_executables():
    """The launch helper starts the stack's nodes plus robot_state_publisher and rviz2, nothing else."""
    tree = ast.parse((PKG_ROOT / "na_bringup" / "launch_common.py").read_text())
    literal_execs = {kw.value.value for n in ast.walk(tree) if isinstance(n, ast.Call)
                     for kw in n.keywords if kw.arg == "executable" and isinstance(kw.value, ast.Constant)}
    assert literal_execs == {"robot_state_publisher", "rviz2"}
