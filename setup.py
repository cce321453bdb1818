"""The package list, found rather than written out: the repository root *is* the `fleetctl` package
(pyproject.toml maps it), so each folder with an `__init__.py` becomes `fleetctl.<folder>`. Everything else
about the build lives in pyproject.toml."""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT_PACKAGE = "fleetctl"
NOT_MODULES = {"setup"}  # .py files of the root that build the package and are no part of it


class PackageModulesOnly(build_py):
    """Builds the package without the build's own files: the root package's folder is the repository root, so
    setuptools would otherwise ship this file as `fleetctl.setup` (whose import runs `setup()` and exits)."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        found = super().find_package_modules(package, package_dir)
        return [(pkg, module, path) for pkg, module, path in found
                if not (pkg == ROOT_PACKAGE and module in NOT_MODULES)]


setup(packages=[ROOT_PACKAGE, *(f"{ROOT_PACKAGE}.{name}" for name in find_packages(exclude=["tests", "tests.*"]))],
      cmdclass={"build_py": PackageModulesOnly})
