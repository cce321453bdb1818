"""scripts/gpu-check's CPU half, so the GPU check cannot rot where no GPU is lent: `--dry-run` collects every GPU
test, inspects a bundle and runs the benchmark code tiny through the Triton interpreter, and `--json` summarizes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check"


def gpu_check(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON": sys.executable})


@pytest.mark.slow
def test_a_dry_run_collects_the_gpu_tests_runs_the_benchmarks_and_writes_its_summary(tmp_path: Path) -> None:
    result = gpu_check("--dry-run", "--json", tmp_path / "summary.json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for table in ("decode attention", "prefill attention", "decode through LLMEngine", "performance targets:"):
        assert table in result.stdout
    assert result.stdout.rstrip().endswith("gpu-check: dry run (no CUDA) passed")

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "dry-run" and summary["ok"] is True
    assert summary["collected_tests"] > 20
    assert f"{summary['collected_tests']} tests collected" in result.stdout
    assert summary["environment"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {"torch", "triton", "cuda_available", "cuda_device", "platform"} <= summary["environment"].keys()
    assert [stage["name"] for stage in summary["stages"]] == ["environment", "gpu tests", "benchmarks"]
    for stage in summary["stages"]:
        assert stage["status"] == "ok" and stage["seconds"] >= 0, stage
    assert summary["bundle"] is None


def test_a_dry_run_fails_on_a_bundle_unfit_to_carry(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (bundle / "rich-15.0.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    result = gpu_check("--dry-run", "--bundle", bundle, "--json", tmp_path / "summary.json")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("gpu-check: FAILED (see above)")

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] is False
    assert [(stage["name"], stage["status"]) for stage in summary["stages"]] == [
        ("environment", "ok"), ("bundle", "failed")]  # nothing runs after a failed bundle
    problems = "\n".join(summary["bundle"]["problems"])
    assert "the device image has torch" in problems
    assert "rich-15.0.0-cp311" in problems and "no fleetctl wheel" in problems


def test_the_options_are_documented() -> None:
    result = gpu_check("--help")
    assert result.returncode == 0
    for option in ("--dry-run", "--json PATH", "--bundle DIR"):
        assert option in result.stdout
