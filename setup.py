"""The package list, found rather than written out: the repository root *is* the `fleetctl` package
(pyproject.toml maps it), so each folder with an `__init__.py` becomes `fleetctl.<folder>`. Everything else
about the build lives in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=["fleetctl", *(f"fleetctl.{name}" for name in find_packages(exclude=["tests", "tests.*"]))])
