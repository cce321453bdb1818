"""The logs view against a real fleet: a worker that printed a request's failure and was then killed mid-run shows
as failed; `/` on the workers table narrows it to that worker, `l` opens on its own lines, its last words among
them, and `/` there narrows the lines."""

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest
from support.console_fixture import pilot_until
from support.fleet_harness import serve, wait_until, worker_pids, workers
from test_console_logs import shown

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens.logs import LogsScreen
from fleetctl.console.tui.source import HttpSource
from fleetctl.console.tui.widgets.workers import WorkersTable

pytestmark = [pytest.mark.fleet, pytest.mark.slow]
FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32", "--no-restart")
POISON = {"FLEET_FAULTS": "step@poison=raise:boom", "FLEET_DEBUG": "1"}
LAST_WORDS = "request poison-1 failed: InjectedFault: boom"


def test_the_logs_of_a_worker_killed_mid_run_open_on_its_last_words(tiny_model_dir: Path) -> None:
    with serve(tiny_model_dir, *FLEET, env=POISON) as url:
        body = {"model": tiny_model_dir.name, "prompt": "hello there", "max_tokens": 4, "temperature": 0}
        httpx.post(f"{url}/v1/completions", headers={"X-Request-Id": "poison-1"}, json=body, timeout=60)
        os.kill(worker_pids(url)["prefill-0"], signal.SIGKILL)
        assert wait_until(lambda: workers(url)["prefill-0"]["state"] == "failed", timeout=30)

        rows: list[int] = []

        async def drive() -> tuple[str, list[str], list[str]]:
            app = FleetConsole(HttpSource(url, None), ConsoleSettings(interval=0.5))
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot_until(pilot, lambda: app.reading.worker("prefill-0") is not None
                                  and app.reading.worker("prefill-0").state == "failed", "prefill-0 failed")
                table = app.query_one(WorkersTable)
                await pilot.press("slash", *"failed", "enter")
                await pilot_until(pilot, lambda: [key.value for key in table.rows] == ["prefill-0"], "one row")
                rows.append(len(app.reading.workers))
                await pilot.press("l")
                await pilot_until(pilot, lambda: isinstance(app.screen, LogsScreen)
                                  and any(LAST_WORDS in line for line in shown(app.screen)), "its last words")
                screen = app.screen
                lines = shown(screen)
                await pilot.press("slash", *"boom", "enter")
                await pilot_until(pilot, lambda: len(shown(screen)) < len(lines), "the filtered lines")
                return screen.source, lines, shown(screen)

        source, lines, filtered = asyncio.run(drive())
    assert rows == [2]  # of the fleet's two workers, the filter kept the failed one (selected: the only row)
    assert source == "prefill-0" and all(" prefill-0 " in line for line in lines)
    assert any(LAST_WORDS in line for line in lines) and all("boom" in line for line in filtered)
