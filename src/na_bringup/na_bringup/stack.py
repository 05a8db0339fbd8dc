"""What runs for each robot: the one description of the stack that the launch files, the
``na-bringup`` runner and the static checks all read, so they cannot drift apart."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "na_bringup"
SIM_LINK_DIR = Path(os.environ.get("NA_SIM_LINK_DIR", "/tmp"))


@dataclass(frozen=True)
class NodeSpec:
    """One node of the stack."""

    package: str     # ROS package that installs the executable
    executable: str  # console script (what launch_ros / ros2 run start)
    name: str        # node name = its section in the parameter YAML
    factory: str     # "module:Class" that the in-process runner instantiates

    def node_class(self):
        module, _, attr = self.factory.partition(":")
        return getattr(importlib.import_module(module), attr)


DRIVER = NodeSpec("na_driver", "driver_node", "na_driver", "na_driver.driver_node:DriverNode")
FRANKA_BRIDGE = NodeSpec("na_driver", "franka_bridge", "franka_bridge", "na_driver.franka_bridge:FrankaBridge")
INFERENCE = NodeSpec("na_inference", "inference_node", "inference_node", "na_inference.node:InferenceNode")

# launch file name -> (robot table name, nodes). The launch files are named after the product,
# the robot tables after the model (franka -> panda).
STACKS: dict[str, tuple[str, tuple[NodeSpec, ...]]] = {
    "so101": ("so101", (DRIVER, INFERENCE)),
    "omx": ("omx", (DRIVER, INFERENCE)),
    "franka": ("panda", (FRANKA_BRIDGE, INFERENCE)),
}


def robot_of(stack: str) -> str:
    try:
        return STACKS[stack][0]
    except KeyError:
        raise ValueError(f"unknown robot {stack!r}; choose from {', '.join(STACKS)}") from None


def nodes_of(stack: str) -> tuple[NodeSpec, ...]:
    robot_of(stack)
    return STACKS[stack][1]


def share_dir() -> Path:
    """The installed share/na_bringup (ament index), else the source folder (a plain checkout)."""
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

        try:
            return Path(get_package_share_directory(PACKAGE))
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    return Path(__file__).resolve().parent.parent


def params_file(stack: str) -> Path:
    """The parameter YAML shared by the launch file and the runner."""
    robot_of(stack)
    path = share_dir() / "config" / f"{stack}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"parameter file {path} is missing (is na_bringup installed?)")
    return path


def sim_link(stack: str) -> Path:
    """Where the simulated arm's emulated serial bus appears (a symlink to its pty)."""
    return SIM_LINK_DIR / f"na_sim_{robot_of(stack)}_{os.getuid()}"


def sim_command(stack: str, link: Path, scenario: str | None = None, extra: list[str] | None = None) -> list[str]:
    """The simulated arm behind its emulated bus (na_sim's console command)."""
    cmd = ["na-sim-bus", "--robot", robot_of(stack), "--link", str(link)]
    if scenario:
        cmd += ["--scenario", scenario]
    return cmd + list(extra or [])
