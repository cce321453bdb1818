"""scripts/gpu-check's CPU half, so the GPU check cannot rot where no GPU is lent: its smoke mode collects every
kernel test and runs the benchmark code tiny through the Triton interpreter."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check"


def test_gpu_check_smoke_collects_the_kernel_tests_and_runs_its_benchmarks() -> None:
    result = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "GPU_CHECK_SMOKE": "1", "PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = re.search(r"^(\d+) tests collected", result.stdout, re.MULTILINE)
    assert collected and int(collected.group(1)) > 20, result.stdout
    for table in ("decode attention", "prefill attention", "performance targets:"):
        assert table in result.stdout
    assert result.stdout.rstrip().endswith("gpu-check: tests and benchmarks ran")
