"""ament_python package na_description (built by colcon, or installed into the venv by scripts/setup.sh)."""

from setuptools import find_packages, setup

PACKAGE = "na_description"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    package_data={PACKAGE: ["robots/*.yaml", "robots/*/*"]},
    data_files=[("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
                (f"share/{PACKAGE}", ["package.xml"])],
    install_requires=["setuptools", "pyyaml"],
    zip_safe=False,
    maintainer="NeuralActuator maintainers",
    maintainer_email="maintainers@neuralactuator.dev",
    description="Robot tables (joint names, servo ids, register maps, limits, model files) and robot descriptions: the single source of truth per robot.",
    license="MIT",
    tests_require=["pytest"],
    entry_points={"console_scripts": []},
)
