"""ament_python package na_sim (built by colcon, or installed into the venv by scripts/setup.sh)."""

from setuptools import find_packages, setup

PACKAGE = "na_sim"

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
