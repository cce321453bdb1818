"""The GPU check for the Triton kernels (issue 4), run by scripts/gpu-check; a few minutes on one H100/H200-class GPU.

Stages: the environment (versions, the CUDA device), the bundle (`--bundle DIR`: installed, or in a dry run
inspected), the GPU tests (tests/kernels and every test that skips as "needs CUDA": run on CUDA, or in a dry run
collected), and the benchmarks (scripts/gpu_bench.py; in a dry run tiny, on CPU through the Triton interpreter).
`--dry-run` checks everything but CUDA, so CI keeps this script working where no GPU is lent; `--json PATH` writes
a summary (environment, each stage's status and seconds) in either mode.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gpu_bundle

CHECKOUT = Path(__file__).resolve().parents[1]
KERNEL_TESTS = "tests/kernels"
# a test marked skipif(..., reason="needs CUDA...") (tests/support/require_all.py's reason for a skip off CUDA)
CUDA_SKIP_MARK = re.compile(r"""reason=["']needs CUDA""")
GPU_TESTS_SECONDS, BENCH_SECONDS = 420, 300


@dataclass
class Stage:
    name: str
    status: str = "skipped"  # ok, failed or skipped
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Summary:
    mode: str
    environment: dict[str, object] = field(default_factory=dict)
    stages: list[Stage] = field(default_factory=list)
    bundle: dict[str, object] | None = None
    collected_tests: int | None = None

    @property
    def ok(self) -> bool:
        return all(stage.status != "failed" for stage in self.stages)

    def run(self, name: str, body: Callable[[], str]) -> bool:
        """Run one stage: `body` returns a detail line, raises StageFailed to fail it."""
        print(f"== {name} ==", flush=True)
        stage = Stage(name)
        start = time.perf_counter()
        try:
            stage.detail, stage.status = body(), "ok"
        except StageFailed as failure:
            stage.detail, stage.status = str(failure), "failed"
        stage.seconds = round(time.perf_counter() - start, 2)
        if stage.detail:
            print(f"{name}: {stage.status}: {stage.detail}", flush=True)
        self.stages.append(stage)
        return stage.status == "ok"

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({**asdict(self), "ok": self.ok}, indent=2) + "\n")


class StageFailed(Exception):
    pass


def gpu_test_runs() -> list[list[str]]:
    """The pytest arguments of each GPU test run: tests/kernels whole, then of every other file with a test marked
    to skip off CUDA only the CUDA cases (ids with "cuda"; their CPU cases run in CI)."""
    others = sorted(str(path.relative_to(CHECKOUT)) for path in (CHECKOUT / "tests").rglob("test_*.py")
                    if KERNEL_TESTS not in str(path.relative_to(CHECKOUT))
                    and CUDA_SKIP_MARK.search(path.read_text()))
    return [[KERNEL_TESTS], [*others, "-k", "cuda"]] if others else [[KERNEL_TESTS]]


def import_env(link_dir: Path) -> dict[str, str]:
    """The environment of the child processes: `import fleetctl` finds this checkout (through a link in `link_dir`),
    whatever its folder's name (the checkout is the package's root) and whatever a bundle installed."""
    (link_dir / "fleetctl").symlink_to(CHECKOUT)
    python_path = os.pathsep.join(filter(None, [str(link_dir), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1",
            "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1")}  # triton 3.9 warns unset


def run_child(command: list[str], env: dict[str, str], timeout: int, capture: bool = False) -> str:
    """Run a child to completion (its output streamed, or captured and returned); fail the stage if it fails."""
    try:
        result = subprocess.run(command, cwd=CHECKOUT, env=env, timeout=timeout, text=True,
                                capture_output=capture)
    except subprocess.TimeoutExpired as err:
        raise StageFailed(f"{' '.join(command[:4])}... ran past {timeout} s") from err
    if capture:
        print(result.stdout[-2000:], result.stderr[-2000:], sep="", end="", flush=True)
    if result.returncode:
        raise StageFailed(f"{' '.join(command[:4])}... exited {result.returncode}")
    return result.stdout if capture else ""


def environment(dry_run: bool) -> dict[str, object]:
    import torch  # here, not at the top: --help needs no torch

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    cuda = torch.cuda.is_available()
    if not cuda and not dry_run:
        raise StageFailed("no CUDA device (--dry-run checks everything but CUDA)")
    if cuda and shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.memory", "--format=csv"])
    return {"python": platform.python_version(), "executable": sys.executable, "platform": platform.platform(),
            "torch": torch.__version__, "triton": version("triton"), "cuda_available": cuda,
            "cuda_device": torch.cuda.get_device_name() if cuda else None}


def bundle_stage(summary: Summary, folder: Path, dry_run: bool) -> str:
    if not folder.is_dir():
        raise StageFailed(f"{folder} is no folder: `make gpu-bundle` builds it")
    bundle = gpu_bundle.inspect(folder)
    summary.bundle = bundle.summary()
    if not gpu_bundle.report(bundle, folder):
        raise StageFailed("the bundle is unfit to carry (above)")
    if not dry_run:
        run_child([sys.executable, "-m", "pip", "install", "--quiet", "--root-user-action=ignore", "--no-index",
                   "--find-links", str(folder), "fleetctl"], dict(os.environ), timeout=300)
        return f"installed fleetctl from {folder} ({len(bundle.wheels)} wheels; pip kept what the image has)"
    return f"{len(bundle.wheels)} wheels, {gpu_bundle.mib(bundle.bytes)} (inspected; installed only on a device)"


def gpu_tests_stage(summary: Summary, env: dict[str, str], dry_run: bool) -> str:
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    deadline = time.monotonic() + GPU_TESTS_SECONDS
    if not dry_run:
        for run in gpu_test_runs():
            run_child([*pytest, *run], env, max(1, int(deadline - time.monotonic())))
        return "passed on CUDA"
    collected = 0
    for run in gpu_test_runs():
        output = run_child([*pytest, *run, "-q", "--collect-only"], env, GPU_TESTS_SECONDS, capture=True)
        per_file = re.findall(r"^\S+\.py: (\d+)$", output, re.MULTILINE)  # "file: count"
        if not per_file:
            raise StageFailed(f"pytest collected no test of {' '.join(run)}")
        collected += sum(map(int, per_file))
    summary.collected_tests = collected
    return f"{collected} tests collected (not run: no CUDA in a dry run)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="no CUDA: collect the GPU tests, run the benchmarks tiny through the Triton interpreter")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write a summary of the run to PATH")
    parser.add_argument("--bundle", type=Path, metavar="DIR",
                        help="install fleetctl from the wheels in DIR first (`make gpu-bundle`; a dry run inspects)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = Summary(mode="dry-run" if args.dry_run else "cuda")

    def record_environment() -> str:
        summary.environment = environment(args.dry_run)
        return ", ".join(f"{key} {summary.environment[key]}" for key in ("python", "torch", "triton", "cuda_device"))

    ready = summary.run("environment", record_environment)
    if ready and args.bundle:
        ready = summary.run("bundle", lambda: bundle_stage(summary, args.bundle.resolve(), args.dry_run))
    if ready:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as link_dir:
            env = import_env(Path(link_dir))
            summary.run("gpu tests", lambda: gpu_tests_stage(summary, env, args.dry_run))
            bench = [sys.executable, str(CHECKOUT / "scripts" / "gpu_bench.py"), *(["--tiny"] * args.dry_run)]
            summary.run("benchmarks", lambda: run_child(bench, env, BENCH_SECONDS))
    if args.json:
        summary.write(args.json)
    done = "dry run (no CUDA) passed" if args.dry_run else "tests and benchmarks ran"
    print(f"gpu-check: {done}" if summary.ok else "gpu-check: FAILED (see above)")
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
