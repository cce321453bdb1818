"""How long fleetctl takes to quit, over repeated runs: the median and the worst of each, counted from the signal
or the key until no process of it runs and no handoff buffer of its is left (tests/support/quitting.py, which the
tests of quitting share).

    python scripts/quit_times.py [--runs 10] [--model DIR]

  sigterm   `serve` (1P+1D on cpu:0,cpu:1, the default --grace), three streams in flight and their KV parked for
            a decode worker stuck adopting it, then SIGTERM to serve
  sigint    the same with --grace 8 and SIGINT to the whole process group, as Ctrl-C sends it
  console-q `fleetctl console` on a pseudo-terminal with its embedded fleet, then `q`

Without --model it writes the tests' tiny random Llama to a temporary directory."""

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.fleet_harness import serve, start_streams, wait_until
from support.quitting import TerminalConsole, process_tree, seconds_until_all_gone
from support.tiny_model import write_tiny_llama

from fleetctl.engine.worker.shm_files import SHM_DIR, buffers

FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32")
STUCK_ADOPTING = {"FLEET_FAULTS": "adopt=stall:600"}


def serve_quit(model: Path, sig: signal.Signals, grace: tuple[str, ...]) -> float:
    with serve(model, *FLEET, *grace, env=STUCK_ADOPTING) as url:
        pid = httpx.get(f"{url}/fleet/status", timeout=10).json()["pid"]
        streams = start_streams(url, [f"Numbers {i} 1 2" for i in range(3)], max_tokens=200, model=model.name)
        assert wait_until(lambda: any(b.fleet_pid == pid for b in buffers(SHM_DIR)), 60), "no handoff parked"
        fleet = process_tree(pid)
        signalled = time.monotonic()
        for process in fleet if sig is signal.SIGINT else fleet[:1]:
            os.kill(process.pid, sig)
        took = seconds_until_all_gone(fleet, signalled, timeout=90)
        streams.exception(30)
    return took


def console_quit(model: Path) -> float:
    console = TerminalConsole("--model", str(model))
    try:
        console.wait_for(b"decode-1", timeout=120)
        everything = process_tree(console.process.pid)
        pressed = time.monotonic()
        console.press(b"q")
        return seconds_until_all_gone(everything, pressed, timeout=60, poll=console.drain)
    finally:
        console.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--model", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quit-times-") as scratch:
        model = args.model or write_tiny_llama(Path(scratch) / "tiny-llama")
        cases: dict[str, tuple[str, Callable[[], float]]] = {
            "sigterm": ("≤ 20 s (default --grace)", lambda: serve_quit(model, signal.SIGTERM, ())),
            "sigint": ("≤ 8 s (--grace 8)", lambda: serve_quit(model, signal.SIGINT, ("--grace", "8"))),
            "console-q": ("≤ 5 s", lambda: console_quit(model)),
        }
        print(f"{'case':<10} {'runs':>4} {'median s':>9} {'max s':>7}  limit")
        for name, (limit, run) in cases.items():
            times = [run() for _ in range(args.runs)]
            print(f"{name:<10} {len(times):>4} {statistics.median(times):>9.2f} {max(times):>7.2f}  {limit}",
                  flush=True)


if __name__ == "__main__":
    main()
