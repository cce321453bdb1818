"""fleetctl as a user installs it: the sdist and the wheel built from it, installed non-editable into a fresh
virtual environment outside the checkout, must hold the package and nothing else, import every module, run its
commands and serve a completion. An editable install (`make install`) cannot see a package missing from the wheel,
or a file that should not be in it; this test can."""

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from fnmatch import fnmatch
from importlib.metadata import version
from pathlib import Path, PurePosixPath

import httpx
import pytest

from fleetctl.console.loadgen.local_fleet import local_fleet

pytestmark = pytest.mark.slow
CHECKOUT = Path(__file__).resolve().parents[1]


def run(*args: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, args))}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built from its sdist as `python -m build` makes them."""
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, CHECKOUT, cwd=dist)
    [built] = dist.glob("fleetctl-*.whl")
    assert len(list(dist.glob("fleetctl-*.tar.gz"))) == 1
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin/` of a fresh venv holding the wheel and this environment's torch (so pip takes the same build,
    never a multi-GB CUDA one on a CPU machine)."""
    root = tmp_path_factory.mktemp("installed")
    run(sys.executable, "-m", "venv", root / "venv", cwd=root)
    pip = root / "venv" / "bin" / "pip"
    run(pip, "install", "--quiet", f"torch=={version('torch')}", cwd=root)
    run(pip, "install", "--quiet", wheel, cwd=root)
    return root / "venv" / "bin"


def package_files(wheel: Path) -> list[PurePosixPath]:
    """The wheel's files but its metadata (`fleetctl-<version>.dist-info/`)."""
    names = [PurePosixPath(name) for name in zipfile.ZipFile(wheel).namelist()]
    return [name for name in names if not name.parts[0].endswith(".dist-info")]


def module_name(path: PurePosixPath) -> str:
    """`fleetctl/engine/fleet/controller.py` → `fleetctl.engine.fleet.controller`; a package's `__init__.py`
    is the package."""
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_wheel_holds_the_package_modules_and_their_data_only(wheel: Path) -> None:
    files = package_files(wheel)
    assert PurePosixPath("fleetctl/engine/planner/plan.py") in files
    assert PurePosixPath("fleetctl/themes/console.tcss") in files
    assert [f for f in files if f.parts[0] != "fleetctl"] == []
    packages = {f.parent for f in files if f.name == "__init__.py"}
    assert [f for f in files if f.suffix == ".py" and f.parent not in packages] == [], "a module outside a package"
    declared = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = {(PurePosixPath(*package.split(".")), pattern) for package, patterns in declared.items()
            for pattern in patterns}
    undeclared = [f for f in files if f.suffix != ".py"
                  and not any(f.parent == folder and fnmatch(f.name, pattern) for folder, pattern in data)]
    assert undeclared == [], "files the package does not declare as its data"
    # the checkout's root is the package's folder: nothing of the build or the checkout may come along
    names = {module_name(f) for f in files if f.suffix == ".py"} | {".".join(f.parent.parts) for f in files}
    assert {"fleetctl.setup", "fleetctl.tests", "fleetctl.scripts", "fleetctl.docs"} & names == set()


# Every module of the installed package imported in turn; the `[ray]` extra's modules only where ray is installed.
IMPORT_EVERY_MODULE = """
import importlib, importlib.util, json, pkgutil, fleetctl
with_ray = importlib.util.find_spec("ray") is not None
walked, imported, failed = [], [], {}
for info in pkgutil.walk_packages(fleetctl.__path__, "fleetctl.", onerror=lambda n: failed.setdefault(n, "walk")):
    walked.append(info.name)
    if info.name.startswith("fleetctl.engine.worker.ray_") and not with_ray:
        continue
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except BaseException as exc:  # SystemExit included: a module whose import runs a program
        failed[info.name] = repr(exc)[:300]
print(json.dumps({"walked": walked, "imported": imported, "failed": failed, "with_ray": with_ray}))
"""


def test_every_module_of_the_installed_wheel_imports(wheel: Path, installed: Path, tmp_path: Path) -> None:
    modules = {module_name(f) for f in package_files(wheel) if f.suffix == ".py"}
    found = json.loads(run(installed / "python", "-c", IMPORT_EVERY_MODULE, cwd=tmp_path).stdout.splitlines()[-1])
    assert found["failed"] == {}
    assert {"fleetctl", *found["walked"]} == modules  # the walk saw every module the wheel holds
    ray_extra = {name for name in modules if name.startswith("fleetctl.engine.worker.ray_")}
    assert len(ray_extra) >= 3
    assert modules - {"fleetctl", *found["imported"]} == (set() if found["with_ray"] else ray_extra)


def test_the_installed_wheel_runs_its_commands(installed: Path, tmp_path: Path) -> None:
    fleetctl = installed / "fleetctl"
    assert run(fleetctl, "--version", cwd=tmp_path).stdout.strip() == f"fleetctl {version('fleetctl')}"
    for command in ("plan", "console", "serve", "migrate", "demo"):
        assert "Usage" in run(fleetctl, command, "--help", cwd=tmp_path).stdout
    where = run(installed / "python", "-c", "import fleetctl; print(fleetctl.__file__)", cwd=tmp_path).stdout
    assert Path(where.strip()).is_relative_to(installed.parent), where  # not this checkout


def test_the_installed_wheel_serves_a_completion(installed: Path, tiny_model_dir: Path) -> None:
    with local_fleet(tiny_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1",
                     command=[str(installed / "fleetctl")]) as url:
        body = {"model": tiny_model_dir.name, "prompt": "hello", "max_tokens": 4, "temperature": 0}
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(f"{url}/fleet/status", timeout=10).status_code == 200
