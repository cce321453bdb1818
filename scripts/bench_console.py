"""The console's own costs, against a real fleet of 8 workers on the tiny test model (or --model):
first paint after `fleetctl console --url …` (process start → the worker table on screen), and the
console process's CPU at its default 1 Hz refresh over --seconds (target: ≤ 1 s and ≤ 5 % of a core).

    python scripts/bench_console.py [--model DIR] [--seconds 30]
"""

import argparse
import os
import pty
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from fleetctl.console.loadgen.local_fleet import FLEETCTL, local_fleet

WORKERS = 8


def tiny_model() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support import tiny_model as tiny  # the test suite's fixture model: random weights, real tokenizer

    return tiny.write_tiny_llama(Path(tempfile.mkdtemp()) / "tiny-llama")


def first_paint_and_cpu(url: str, seconds: float) -> tuple[float, float]:
    """Run the console on a pseudo-terminal: seconds to the first frame with the worker table, and
    its CPU (percent of one core) over the next `seconds`."""
    controller, terminal = pty.openpty()
    os.set_blocking(controller, False)
    env = {**os.environ, "COLUMNS": "160", "LINES": "48", "TERM": "xterm-256color"}
    start = time.perf_counter()
    console = subprocess.Popen([*FLEETCTL, "console", "--url", url], stdin=terminal, stdout=terminal,
                               stderr=terminal, env=env, start_new_session=True)
    screen = b""
    try:
        while b"decode-" not in screen:
            if time.perf_counter() - start > 30 or console.poll() is not None:
                raise RuntimeError(f"no first paint: {screen[-400:]!r}")
            if select.select([controller], [], [], 0.05)[0]:
                screen += os.read(controller, 1 << 16)
        painted = time.perf_counter() - start
        process = psutil.Process(console.pid)
        before = process.cpu_times()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # keep the pty drained, as a terminal would
            if select.select([controller], [], [], 0.2)[0]:
                os.read(controller, 1 << 16)
        after = process.cpu_times()
        used = (after.user - before.user) + (after.system - before.system)
        return painted, 100 * used / seconds
    finally:
        console.terminate()
        console.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    model = args.model or tiny_model()
    devices = ",".join(f"cpu:{i}" for i in range(WORKERS))
    with local_fleet(model, "--prefill", "2", "--decode", str(WORKERS - 2), "--devices", devices) as url:
        painted, cpu = first_paint_and_cpu(url, args.seconds)
    print(f"first paint {painted:.2f} s (target ≤ 1 s); console CPU at 1 Hz with {WORKERS} workers "
          f"{cpu:.1f} % of a core (target ≤ 5 %)")


if __name__ == "__main__":
    main()
