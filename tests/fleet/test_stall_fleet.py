"""A worker that stops stepping while it holds sessions is named stalled within its bound: a real decode worker
is SIGSTOPped under streams (its heartbeat stops too, but the watchdog's timeout is set far off), and
/fleet/status, /metrics, the store's events and the console's worker table all say so; after SIGCONT it steps
again, the stall ends with an event, and every stream ends exactly as `generate` makes it. The same fleet's KV
flow names the route its prompts were handed off on."""

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from support.console_fixture import pilot_until
from support.fleet_harness import generate_json, serve, start_streams, wait_until, workers

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.source import HttpSource
from fleetctl.console.tui.widgets.workers import WorkersTable
from fleetctl.engine.api.admin_token import read_admin_token
from fleetctl.engine.fleet.stalls import STALL_FLOOR_S

pytestmark = pytest.mark.fleet  # real worker processes and a real server

PROMPTS = ["The quick brown fox", "Once upon a time"]
TOKENS = 160
FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--deterministic",
         "--heartbeat-timeout", "60")
CHECK_EVERY_S = 1.0  # the controller looks for stalls once a second


def stall_events(url: str) -> list[dict]:
    events = httpx.get(f"{url}/fleet/history", params={"since": 600}, timeout=10).json()["events"]
    return [event["details"] for event in events if event["kind"] == "stall" and event["worker"] == "decode-0"]


def test_a_stopped_decode_worker_is_named_stalled_within_its_bound(tiny_model_dir: Path) -> None:
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, "--dtype", "float32", "--deterministic",
                                                  "--max-tokens", str(TOKENS), "--ignore-eos")]
    with serve(tiny_model_dir, *FLEET, env={"FLEET_FAULTS": "step=stall:0.02"}) as url:
        texts = start_streams(url, PROMPTS, TOKENS)
        assert wait_until(lambda: workers(url)["decode-0"]["sessions"] == len(PROMPTS), timeout=60)
        pid = workers(url)["decode-0"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            assert wait_until(lambda: workers(url)["decode-0"]["stalled_s"] is not None, timeout=30)
            seen_after = time.monotonic() - stopped_at
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
            stalled_gauge = next(line for line in metrics.splitlines()
                                 if line.startswith('fleet_worker_stalled_seconds{') and '"decode-0"' in line)

            async def console_cell() -> str:
                app = FleetConsole(HttpSource(url, read_admin_token()), ConsoleSettings(interval=0.5))
                async with app.run_test(size=(120, 40)) as pilot:
                    await pilot_until(pilot, lambda: app.reading.worker("decode-0") is not None)
                    return str(app.query_one(WorkersTable).get_cell("decode-0", "state"))

            cell = asyncio.run(console_cell())
            assert not texts.done()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert texts.result(timeout=300) == reference
        assert wait_until(lambda: workers(url)["decode-0"]["stalled_s"] is None, timeout=10)
        assert wait_until(lambda: len(stall_events(url)) == 2, timeout=10)
        began, ended = stall_events(url)
        flow = httpx.get(f"{url}/fleet/status", timeout=10).json()["flow"]
    # its steps take ~20 ms (the fault's stall and the tiny model's step): the floor is its bound
    assert seen_after <= STALL_FLOOR_S + CHECK_EVERY_S + 1.0, seen_after
    assert float(stalled_gauge.rsplit(" ", 1)[1]) > 0
    assert cell.startswith("stalled ")
    assert began["stalled"] is True and began["sessions"] == len(PROMPTS) and began["bound_s"] == STALL_FLOOR_S
    assert ended["stalled"] is False and ended["ended"] == "it steps again" and ended["lasted_s"] >= seen_after
    # both prompts reached decode-0 by handoff from prefill-0 (the KV flow of the last minute)
    assert (flow["handoffs"], flow["local_prefills"], flow["recomputes"]) == (len(PROMPTS), 0, 0)
    [route] = flow["routes"]
    assert (route["prefill"], route["decode"], route["handoffs"]) == ("prefill-0", "decode-0", len(PROMPTS))
    assert route["bytes_per_s"] > 0 and 0 < route["p99_s"] < 5
