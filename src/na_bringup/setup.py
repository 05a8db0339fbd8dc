"""ament_python package na_bringup (built by colcon, or installed into the venv by scripts/setup.sh)."""

from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "na_bringup"
HERE = Path(__file__).parent


def share_files() -> list[tuple[str, list[str]]]:
    """package.xml, the ament index marker, and every file under launch/, config/ and rviz/, kept in their folders."""
    files = [("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
             (f"share/{PACKAGE}", ["package.xml"])]
    for folder in ("launch", "config", "rviz"):
        for path in sorted((HERE / folder).rglob("*")):
            if path.is_file():
                rel = path.relative_to(HERE)
                files.append((f"share/{PACKAGE}/{rel.parent}", [str(rel)]))
    return files


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=share_files(),
    install_requires=["setuptools"],
    zip_safe=False,
    maintainer="NeuralActuator maintainers",
    maintainer_email="maintainers@neuralactuator.dev",
    description="Launch files, parameter files, RViz config and the na-bringup runner for the NeuralActuator stack.",
    license="MIT",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "na-bringup = na_bringup.runner:main",
        ]
    },
)
