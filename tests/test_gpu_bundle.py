"""`make gpu-bundle` (scripts/gpu_bundle.py): the wheels a GPU device machine (Python 3.12, torch and triton
already there, no network) needs to install fleetctl, small enough to carry to it."""

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name, parse_wheel_filename

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_bundle.py"
CARRY_LIMIT = 64 * 2**20


def installs_on_cpython_312_manylinux(wheel: str) -> bool:
    def fits(interpreter: str, abi: str, platform: str) -> bool:
        python = interpreter in ("py3", "py312", "cp312") or (abi == "abi3" and interpreter.startswith("cp3")
                                                              and int(interpreter[3:]) <= 12)
        return python and abi in ("none", "abi3", "cp312") and (
            platform == "any" or (platform.startswith("manylinux") and platform.endswith("_x86_64")))

    return any(fits(tag.interpreter, tag.abi, tag.platform) for tag in parse_wheel_filename(wheel)[3])


@pytest.mark.slow
def test_the_bundle_holds_fleetctl_and_its_needs_for_python_312_less_the_image(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    result = subprocess.run([sys.executable, str(SCRIPT), str(bundle)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    wheels = sorted(path.name for path in bundle.iterdir())
    assert all(wheel.endswith(".whl") for wheel in wheels), wheels
    names = {canonicalize_name(parse_wheel_filename(wheel)[0]) for wheel in wheels}
    assert len(names) == len(wheels), "one version of each"
    assert {"fleetctl", "fastapi", "sqlmodel", "gguf", "uvicorn", "pydantic-core"} <= names
    assert not {name for name in names if name in ("torch", "triton") or name.startswith("nvidia-")}
    assert [wheel for wheel in wheels if not installs_on_cpython_312_manylinux(wheel)] == []
    total = sum(path.stat().st_size for path in bundle.iterdir())
    assert total < CARRY_LIMIT
    assert f"{len(wheels)} wheels, {total / 2**20:.1f} MiB" in result.stdout
