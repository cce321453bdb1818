"""The console's own costs, against a real fleet of 8 workers on the tiny test model (or --model) holding
--requests live streams (their steps slowed so they stay live): first paint after `fleetctl console --url …`
(process start → the worker table on screen), and the console process's CPU at its default 1 Hz refresh over
--seconds on the dashboard and then on the requests view (`R`; target: ≤ 1 s and ≤ 5 % of a core); with a
`prometheus` on PATH, also how long its scrapes of the fleet's /metrics take.

    python scripts/bench_console.py [--model DIR] [--seconds 30] [--requests 200]
"""

import argparse
import asyncio
import os
import pty
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil

from fleetctl.console.loadgen.local_fleet import FLEETCTL, local_fleet

WORKERS = 8
STALL_S = 0.1  # each engine step slowed by this (FLEET_FAULTS), so the streams stay live while measured


def tiny_model() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support import tiny_model as tiny  # the test suite's fixture model: random weights, real tokenizer

    return tiny.write_tiny_llama(Path(tempfile.mkdtemp()) / "tiny-llama")


def live_streams(url: str, model: str, count: int) -> threading.Thread:
    """`count` streamed completions long enough to outlast the measurement, in a thread of their own."""
    context = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["max_model_len"]

    async def stream(client: httpx.AsyncClient) -> None:
        body = {"model": model, "prompt": "A live request.", "max_tokens": context // 2,
                "ignore_eos": True, "stream": True}
        async with client.stream("POST", f"{url}/v1/completions", json=body) as answer:
            async for _ in answer.aiter_bytes():
                pass

    async def run() -> None:
        async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=count)) as client:
            await asyncio.gather(*(stream(client) for _ in range(count)), return_exceptions=True)

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    return thread


def live_count(url: str) -> int:
    return len(httpx.get(f"{url}/fleet/requests", timeout=10).json().get("live", []))


def scrape_seconds(url: str, seconds: float) -> float | None:
    """The mean duration of a real Prometheus's scrapes of the fleet's /metrics over `seconds` (1 s interval),
    or None without a `prometheus` binary."""
    binary = shutil.which("prometheus")
    if binary is None:
        return None
    folder = Path(tempfile.mkdtemp())
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n"
        f"  - {{job_name: fleetctl, static_configs: [{{targets: ['{urlsplit(url).netloc}']}}]}}\n")
    with socket.socket() as probe:  # a free port for its web listener
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([binary, f"--config.file={folder / 'prometheus.yml'}",
                                f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(seconds)
        answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", timeout=10, params={
            "query": f'avg_over_time(scrape_duration_seconds{{job="fleetctl"}}[{int(seconds)}s])'}).json()
        return float(answer["data"]["result"][0]["value"][1])
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def first_paint_and_cpu(url: str, seconds: float) -> tuple[float, float, float]:
    """Run the console on a pseudo-terminal: seconds to the first frame with the worker table, and
    its CPU (percent of one core) over the next `seconds` on the dashboard, then as long on the requests view."""
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
        dashboard = _cpu(process, controller, seconds)
        os.write(controller, b"R")
        return painted, dashboard, _cpu(process, controller, seconds)
    finally:
        console.terminate()
        deadline = time.monotonic() + 10
        while console.poll() is None and time.monotonic() < deadline:  # it restores the terminal as it goes
            if select.select([controller], [], [], 0.2)[0]:
                os.read(controller, 1 << 16)
        if console.poll() is None:
            console.kill()
            raise RuntimeError("the console did not quit within 10 s of SIGTERM")


def _cpu(process: psutil.Process, controller: int, seconds: float) -> float:
    """Percent of one core `process` used over `seconds`, the pty kept drained as a terminal would."""
    before = process.cpu_times()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if select.select([controller], [], [], 0.2)[0]:
            os.read(controller, 1 << 16)
    after = process.cpu_times()
    return 100 * ((after.user - before.user) + (after.system - before.system)) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--requests", type=int, default=200, help="live streams while the console runs")
    args = parser.parse_args()
    model = args.model or tiny_model()
    devices = ",".join(f"cpu:{i}" for i in range(WORKERS))
    fleet = ("--prefill", "2", "--decode", str(WORKERS - 2), "--devices", devices, "--max-num-seqs", "64")
    with local_fleet(model, *fleet, env={"FLEET_FAULTS": f"step=stall:{STALL_S}"}) as url:
        live_streams(url, model.name, args.requests)
        deadline = time.monotonic() + 120
        while (live := live_count(url)) < args.requests and time.monotonic() < deadline:
            time.sleep(1)
        painted, dashboard, requests_view = first_paint_and_cpu(url, args.seconds)
        scrape = scrape_seconds(url, min(args.seconds, 20))
        still_live = live_count(url)
    print(f"{WORKERS} workers, {live} live requests when the console attached ({still_live} at the end)")
    print(f"first paint {painted:.2f} s (target ≤ 1 s); console CPU at 1 Hz: dashboard {dashboard:.1f} % of a core, "
          f"requests view {requests_view:.1f} % (target ≤ 5 %)")
    if scrape is not None:
        print(f"Prometheus scrape of /metrics: {scrape * 1000:.1f} ms (mean over 1 s scrapes)")


if __name__ == "__main__":
    main()
