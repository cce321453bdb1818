"""`make gpu-bundle`: the wheels a GPU device machine lacks, so fleetctl installs there with no network.

The device image (Python 3.12, torch 2.11, triton 3.6, numpy 2.x; /work/.library/device/KINDS.md lists it) has no
registry access and no fastapi, sqlmodel, gguf, ...; a run carries at most 64 MiB (the working tree plus the
carried paths). This script resolves fleetctl's runtime dependencies for CPython 3.12 on manylinux x86_64
(pinned by constraints.txt), downloads every wheel but those the image provides (torch, triton, nvidia-*, numpy),
adds fleetctl's own wheel and checks the tags and the size. There:

    python3 -m pip install --no-index --find-links .gpu-bundle fleetctl    (scripts/gpu-check --bundle does it)

pip keeps an installed package whose version fits and takes the bundle's wheel otherwise.
Usage: python scripts/gpu_bundle.py [DIR]   (default .gpu-bundle; python: one with pip, build and setuptools)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

CHECKOUT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = CHECKOUT / ".gpu-bundle"
LIMIT_BYTES = 64 * 2**20  # what one device run carries: the working tree and the carried paths together
TARGET_PYTHON = (3, 12)
# manylinux x86_64 up to glibc 2.39 (the image is Ubuntu 24.04); pip matches each --platform exactly
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(39, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
PIP_TARGET = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
              *(arg for platform in PLATFORMS for arg in ("--platform", platform))]
ON_THE_IMAGE = re.compile(r"^(torch|triton|numpy|nvidia-.*)$")  # never carried: the image has them


def target_tags() -> set[Tag]:
    """Every wheel tag CPython 3.12 on manylinux x86_64 installs."""
    return set(cpython_tags(TARGET_PYTHON, abis=["cp312"], platforms=PLATFORMS)) | set(
        compatible_tags(TARGET_PYTHON, interpreter="cp312", platforms=PLATFORMS))


def on_the_image(name: str) -> bool:
    return bool(ON_THE_IMAGE.match(canonicalize_name(name)))


@dataclass
class Bundle:
    """What a bundle folder holds, and what is wrong with it."""

    wheels: dict[str, int]  # file name -> bytes
    tree_bytes: int  # the working tree that travels with it

    @property
    def bytes(self) -> int:
        return sum(self.wheels.values())

    def problems(self) -> list[str]:
        tags = target_tags()
        found = []
        names = [parse_wheel_filename(wheel)[0] for wheel in self.wheels]
        for wheel, name in zip(self.wheels, names, strict=True):
            if on_the_image(name):
                found.append(f"{wheel}: the device image has {name}; it must not travel")
            if not tags & parse_wheel_filename(wheel)[3]:
                found.append(f"{wheel}: no tag CPython 3.12 on manylinux x86_64 installs")
        for name in {n for n in names if names.count(n) > 1}:
            found.append(f"two wheels of {name}: pip refuses to choose")
        if "fleetctl" not in names:
            found.append("no fleetctl wheel")
        if self.bytes + self.tree_bytes > LIMIT_BYTES:
            found.append(f"{mib(self.bytes)} of wheels + {mib(self.tree_bytes)} of working tree is over "
                         f"the {mib(LIMIT_BYTES)} a device run carries")
        return found

    def summary(self) -> dict[str, object]:
        return {"wheels": self.wheels, "bytes": self.bytes, "tree_bytes": self.tree_bytes,
                "limit_bytes": LIMIT_BYTES, "problems": self.problems()}


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def working_tree_bytes() -> int:
    """Tracked and untracked-but-not-ignored files: what a device run sends besides the carried paths (0 where
    this is no git checkout, as on the device machine, where the limit is behind us)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=CHECKOUT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    paths = (CHECKOUT / name for name in listed.decode().split("\0") if name)
    return sum(path.stat().st_size for path in paths if path.is_file())


def inspect(folder: Path) -> Bundle:
    return Bundle({wheel.name: wheel.stat().st_size for wheel in sorted(folder.glob("*.whl"))}, working_tree_bytes())


def pip(*args: str | Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *map(str, args)], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"gpu-bundle: pip {args[0]} failed (is there an index with CPython 3.12 manylinux "
                         f"wheels? pip needs one to build the bundle):\n{result.stderr[-3000:]}")


def runtime_requirements() -> list[str]:
    """pyproject's `dependencies`, less the packages the image provides."""
    declared = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [spec for spec in declared if not on_the_image(Requirement(spec).name)]


def resolve() -> dict[str, str]:
    """The wheels (file name -> name==version) of the requirements and everything they need, for CPython 3.12."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", report,
            "-c", CHECKOUT / "constraints.txt", *PIP_TARGET, *runtime_requirements())
        resolved = json.loads(report.read_text())["install"]
    wheels = {item["download_info"]["url"].rsplit("/", 1)[-1]: item["metadata"] for item in resolved}
    return {wheel: f"{meta['name']}=={meta['version']}" for wheel, meta in wheels.items()
            if not on_the_image(meta["name"])}


def build_fleetctl_wheel(folder: Path) -> None:
    """fleetctl's wheel, built from its sdist (as a user's pip would) so no stale build/ file slips in."""
    for old in folder.glob("fleetctl-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", scratch, CHECKOUT],
                       check=True, capture_output=True)
        [wheel] = Path(scratch).glob("fleetctl-*.whl")
        shutil.copy(wheel, folder)


def build(folder: Path) -> Bundle:
    folder.mkdir(parents=True, exist_ok=True)
    wanted = resolve()
    for stale in folder.glob("*.whl"):
        if stale.name not in wanted and not stale.name.startswith("fleetctl-"):
            stale.unlink()
    missing = [spec for wheel, spec in wanted.items() if not (folder / wheel).exists()]
    if missing:
        pip("download", "--no-deps", "--quiet", *PIP_TARGET, "-d", folder, *missing)
    build_fleetctl_wheel(folder)
    return inspect(folder)


def report(bundle: Bundle, folder: Path) -> bool:
    """Print the bundle's contents and size; whether it is fit to carry."""
    for wheel, size in bundle.wheels.items():
        print(f"  {size / 2**20:7.2f} MiB  {wheel}")
    print(f"{folder}: {len(bundle.wheels)} wheels, {mib(bundle.bytes)} "
          f"(+ {mib(bundle.tree_bytes)} of working tree; a device run carries {mib(LIMIT_BYTES)})")
    for problem in bundle.problems():
        print(f"gpu-bundle: {problem}")
    return not bundle.problems()


def main() -> int:
    folder = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else DEFAULT_DIR
    return 0 if report(build(folder), folder) else 1


if __name__ == "__main__":
    sys.exit(main())
