"""The logs view (`l`) on the fixture fleet: every source's lines in order, a failed worker selected opens on its
own last lines (the traceback and the exception closing it), `w` steps through the sources, `/` filters by words;
and its pictures."""

import asyncio
import re

import pytest
from support.console_fixture import PICTURE_IDS, PICTURE_SIZES, FixtureSource, pilot_until
from textual.widgets import RichLog

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens.logs import LogsScreen
from fleetctl.tests.console.tui.test_console_actions import select

WIDE = (120, 40)


def shown(screen: LogsScreen) -> list[str]:
    """The log lines on screen, each with its time and source, a wrapped one joined again."""
    entries: list[str] = []
    for strip in screen.query_one("#log-lines", RichLog).lines:
        if re.match(r"\d\d:\d\d:\d\d ", strip.text) or not entries:
            entries.append(strip.text.rstrip())
        else:
            entries[-1] += " " + strip.text.strip()
    return entries


async def opened(pilot, worker: str | None = None) -> LogsScreen:
    app = pilot.app
    await pilot_until(pilot, lambda: app.reading.reachable, "the first reading")
    if worker is not None:
        select(app, worker)
    await pilot.press("l")
    await pilot_until(pilot, lambda: isinstance(app.screen, LogsScreen) and app.screen.lines, "the log lines")
    await pilot.pause(0.1)
    return app.screen


def test_logs_follow_every_source_then_a_failed_worker_opens_on_its_own_lines() -> None:
    async def run() -> tuple[list[str], ...]:
        app = FleetConsole(FixtureSource(), ConsoleSettings(theme="fleet-dark"))
        async with app.run_test(size=WIDE) as pilot:
            every = shown(await opened(pilot))
            await pilot.press("escape")
            screen = await opened(pilot, "decode-5")
            failed = shown(screen)
            title = screen.query_one("#log-lines", RichLog).border_title
            await pilot.press("w")  # decode-5 → every source again (the list wraps)
            await pilot.pause(0.1)
            wrapped = shown(screen)
            await pilot.press("slash", *"memory")
            await pilot.pause(0.1)
            filtered = shown(screen)
            await pilot.press("escape", "escape")  # clear the filter, then leave
            await pilot.pause(0.1)
            return every, failed, wrapped, filtered, [title], [type(app.screen).__name__]

    every, failed, wrapped, filtered, title, screen = asyncio.run(run())
    assert len(every) == 7 and "6 workers ready" in every[0] and "sessions recomputed" in every[-1]
    assert len(failed) == 4 and "Traceback" in failed[1] and "not enough memory" in failed[-1]
    assert title == ["logs · decode-5"]
    assert len(wrapped) == 7
    assert len(filtered) == 1 and "not enough memory" in filtered[0]
    assert screen == ["Screen"]


@pytest.mark.pictures
@pytest.mark.parametrize("size", PICTURE_SIZES, ids=PICTURE_IDS)
def test_logs_picture(snap_compare, size: tuple[int, int]) -> None:
    app = FleetConsole(FixtureSource(), ConsoleSettings(theme="fleet-dark"))
    assert snap_compare(app, terminal_size=size, run_before=opened)
