"""fleetctl as a user installs it: the sdist and the wheel built from it, installed non-editable into a fresh
virtual environment outside the checkout, must run its commands and serve a completion. An editable install
(`make install`) cannot see a package missing from the wheel; this test can."""

import os
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

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
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin/` of a fresh venv holding this checkout's wheel (built from its sdist) and this environment's
    torch (so pip takes the same build, never a multi-GB CUDA one on a CPU machine)."""
    root = tmp_path_factory.mktemp("installed")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", root / "dist", CHECKOUT, cwd=root)
    [wheel] = (root / "dist").glob("fleetctl-*.whl")
    assert len(list((root / "dist").glob("fleetctl-*.tar.gz"))) == 1
    names = zipfile.ZipFile(wheel).namelist()
    assert "fleetctl/engine/planner/plan.py" in names and "fleetctl/themes/console.tcss" in names
    assert not [n for n in names if n.startswith(("fleetctl/tests/", "fleetctl/scripts/"))]
    run(sys.executable, "-m", "venv", root / "venv", cwd=root)
    pip = root / "venv" / "bin" / "pip"
    run(pip, "install", "--quiet", f"torch=={version('torch')}", cwd=root)
    run(pip, "install", "--quiet", wheel, cwd=root)
    return root / "venv" / "bin"


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
