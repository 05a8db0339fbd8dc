"""ament_python package na_inference (built by colcon, or installed into the venv by scripts/setup.sh)."""

from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "na_inference"
HERE = Path(__file__).parent


def share_files() -> list[tuple[str, list[str]]]:
    """package.xml, the ament index marker, and every file under models/ (a link to the top-level models/), kept in their folders."""
    files = [("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
             (f"share/{PACKAGE}", ["package.xml"])]
    for folder in ("models",):
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
    description="NeuralActuator model: NAD loader, feature pipeline, differentiable dynamics, training/evaluation/export, and the ONNX Runtime engine and node.",
    license="MIT",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "inference_node = na_inference.node:main",
            "na-train = na_inference.train:main",
            "na-eval = na_inference.evaluate:main",
            "na-export = na_inference.export:main",
            "na-bench = na_inference.bench:main",
        ]
    },
)
