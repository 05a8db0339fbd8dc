"""ament_python package na_driver (built by colcon, or installed into the venv by scripts/setup.sh)."""

from setuptools import find_packages, setup

PACKAGE = "na_driver"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
                (f"share/{PACKAGE}", ["package.xml"])],
    install_requires=["setuptools"],
    zip_safe=False,
    maintainer="NeuralActuator maintainers",
    maintainer_email="maintainers@neuralactuator.dev",
    description="Servo bus drivers (Feetech STS3215, Dynamixel XM430), Franka bridge, twin-arm teleop and NAD recorder for NeuralActuator.",
    license="MIT",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "driver_node = na_driver.driver_node:main",
            "teleop_node = na_driver.teleop_node:main",
            "franka_bridge = na_driver.franka_bridge:main",
            "na-record = na_driver.recorder:main",
            "na-driver-bench = na_driver.bench:main",
        ]
    },
)
