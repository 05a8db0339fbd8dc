"""ament_python package na_sim (installed by colcon, or by scripts/setup.sh into the venv)."""

from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "na_sim"
HERE = Path(__file__).parent
# Folders installed to share/$PACKAGE (scripts/setup.sh links the same list for venv installs).
SHARE_DIRS = ("launch", "config", "rviz", "urdf", "mjcf", "robots", "meshes", "models")


def share_files() -> list[tuple[str, list[str]]]:
    files = [
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
    ]
    for folder in SHARE_DIRS:
        for path in sorted((HERE / folder).rglob("*")):
            if path.is_file():
                rel = path.relative_to(HERE)
                files.append((f"share/{PACKAGE}/{rel.parent}", [str(rel)]))
    return files


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    include_package_data=True,
    data_files=share_files(),
    install_requires=["setuptools"],
    zip_safe=False,
    maintainer="NeuralActuator maintainers",
    maintainer_email="maintainers@neuralactuator.dev",
    description="Simulated arms (MuJoCo + servo actuator physics) behind protocol-accurate Dynamixel and Feetech bus emulators; synthetic NAD data.",
    license="MIT",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "na-sim-bus = na_sim.cli:bus_main",
            "na-sim-dataset = na_sim.cli:dataset_main",
            "na-sim-bench = na_sim.bench:main",
        ]
    },
)
