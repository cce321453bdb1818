"""The dashboard's layout and what it answers to beyond the action keys: the workers table as tall as its rows,
`/` filtering it, the events across the screen — `enter` or a click opening one — the trends charts spanning the
whole history window, and a click selecting a worker; at 80×24, 120×40 and 200×60 every panel fits the screen;
worker actions off on views that do not show the worker; a pool's structured-output line as its width allows."""

import asyncio

import pytest
from support.console_fixture import HISTORY, POOLS, WORKERS, FixtureSource, footer_fitted, pilot_until
from textual.widgets import Input, Label

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens.dialogs import ConfirmDialog
from fleetctl.console.tui.screens.event_detail import EventDetail, event_fields
from fleetctl.console.tui.screens.requests import RequestsScreen
from fleetctl.console.tui.screens.worker_detail import WorkerDetail
from fleetctl.console.tui.widgets.panels import EventsPanel
from fleetctl.console.tui.widgets.trends import fitted, trend_rows
from fleetctl.console.tui.widgets.workers import WorkersTable

SIZES = [(80, 24), (120, 40), (200, 60)]


def console() -> FleetConsole:
    return FleetConsole(FixtureSource(), ConsoleSettings(theme="fleet-dark"))


async def loaded(pilot) -> None:
    await pilot_until(pilot, lambda: pilot.app.reading.reachable, "the first reading")
    await pilot.pause(0.1)


def rows(app: FleetConsole) -> list[str]:
    table = app.query_one(WorkersTable)
    return [key.value for key in table.rows]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_panel_fits_the_screen_and_the_workers_table_its_rows(size: tuple[int, int]) -> None:
    async def run() -> None:
        app = console()
        async with app.run_test(size=size) as pilot:
            await loaded(pilot)
            screen = app.screen.region
            await pilot_until(pilot, lambda: footer_fitted(app), "the footer holding only keys that fit")
            for widget in app.screen.query("*"):
                if widget.display and widget.region.area:
                    assert screen.contains_region(widget.region), f"{widget!r} at {widget.region} is off {size}"
            table, events = app.query_one(WorkersTable), app.query_one(EventsPanel)
            assert events.region.height >= 5 and events.region.width >= 36
            if size[1] >= 40:  # room for all 8 rows: the table is as tall as them (header, rows, border)
                assert table.region.height == len(WORKERS) + 3
                assert events.region.width == size[0]  # the events across the screen

    asyncio.run(run())


def test_slash_filters_the_workers_table_and_escape_clears_it() -> None:
    async def run() -> None:
        app = console()
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot)
            await pilot.press("slash")
            field = app.query_one("#workers-filter", Input)
            assert field.display and field.has_focus
            await pilot.press(*"int4 drain")  # every word, in any cell
            await pilot_until(pilot, lambda: rows(app) == ["decode-3"], "only decode-3")
            assert "filter: int4 drain (1 of 8)" in str(app.query_one(WorkersTable).border_title)
            await pilot.press("enter")  # the words kept, back on the table
            await pilot.pause(0.1)
            assert not field.display and app.query_one(WorkersTable).has_focus and rows(app) == ["decode-3"]
            await pilot.pause(1.2)  # a refresh keeps the filter
            assert rows(app) == ["decode-3"]
            await pilot.press("slash", "escape")
            await pilot_until(pilot, lambda: len(rows(app)) == len(WORKERS), "every worker again")
            assert not field.display and app.query_one(WorkersTable).border_title == "workers"

    asyncio.run(run())


def test_enter_or_a_click_on_an_event_opens_every_field_of_it() -> None:
    restore = HISTORY.events[-1]

    async def run() -> None:
        app = console()
        async with app.run_test(size=(80, 24)) as pilot:
            await loaded(pilot)
            await pilot.press("tab", "end", "enter")
            await pilot_until(pilot, lambda: isinstance(app.screen, EventDetail), "the event's details")
            assert app.screen.event == restore
            await pilot.press("escape")
            await pilot_until(pilot, lambda: not isinstance(app.screen, EventDetail), "the dashboard")
            events = app.query_one(EventsPanel)
            await pilot.press("home")  # the list back at its oldest event
            await pilot.click(EventsPanel, offset=(3, 1))  # its line (inside the border)
            await pilot_until(pilot, lambda: isinstance(app.screen, EventDetail), "the clicked event's details")
            assert app.screen.event == events.events[0]

    asyncio.run(run())
    fields = dict(event_fields(restore))
    assert fields["reason"] == "torch: checkpoint has '2.12'" and fields["time"].endswith("UTC")
    assert fields["worker"] == "decode-4"


def test_a_click_selects_a_worker_row() -> None:
    async def run() -> str | None:
        app = console()
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot)
            table = app.query_one(WorkersTable)
            assert table.selected_worker == "prefill-0"
            await pilot.click(WorkersTable, offset=(4, 1 + 3))  # the header's line, then the third row
            await pilot.pause(0.1)
            return table.selected_worker

    assert asyncio.run(run()) == "decode-0"


def test_trends_span_the_window_whatever_the_width() -> None:
    series: list[float | None] = [float(i) for i in range(60)]
    assert fitted(series, 20) == pytest.approx([(3 * k + 1) / 58 for k in range(20)])  # means of 3, over the peak
    assert len(fitted(series, 7)) == 7  # runs of 9 from the newest: the oldest run short
    assert fitted([1.0, None, 3.0], 6) == [1 / 3, 1 / 3, 0.0, 0.0, 1.0, 1.0]  # a gap is nothing; widened
    assert fitted([None, None], 4) == [0.0] * 4 and fitted([], 5) == [] and fitted(series, 0) == []
    trends = trend_rows(asyncio.run(FixtureSource().read()))
    assert [label for label, _, _ in trends] == ["prefill tok/s", "decode tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                                                 "TPOT p99"]
    ttft_p99 = trends[3]
    assert len(ttft_p99[1]) == 59 and ttft_p99[2] == "450 ms"  # the settled buckets; the newest value


def test_worker_actions_answer_on_the_dashboard_and_a_workers_detail_only() -> None:
    """On the requests view `d` would drain a worker the operator cannot see: the dashboard's actions are off (and
    out of its footer) there; on a worker's detail they act on that worker."""
    async def run() -> tuple[str, str, str]:
        app = console()
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot)
            await pilot.press("R")
            await pilot_until(pilot, lambda: isinstance(app.screen, RequestsScreen), "the requests view")
            await pilot.press("d")
            await pilot.pause(0.2)
            on_requests = type(app.screen).__name__
            await pilot.press("escape")
            await pilot_until(pilot, lambda: len(app.screen_stack) == 1, "the dashboard")
            await pilot.press("down", "enter")
            await pilot_until(pilot, lambda: isinstance(app.screen, WorkerDetail), "the worker's detail")
            await pilot.press("d")
            await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the drain question")
            question = str(app.screen.question)
            await pilot.press("escape")
            return on_requests, question, type(app.screen).__name__

    on_requests, question, after = asyncio.run(run())
    assert on_requests == "RequestsScreen" and "prefill-1" in question and after == "WorkerDetail"


def test_a_pools_structured_requests_line_shows_once_it_has_one_and_fits_its_width_after_a_resize() -> None:
    source = FixtureSource()
    source.more_pools = {"decode": POOLS["decode"].model_copy(update={"structured_requests": {"json_object": 3,
                                                                                              "tools": 11}})}

    def shown(app: FleetConsole) -> tuple[bool, str]:
        """Whether the prefill pool shows the line, and the decode pool's."""
        prefill, decode = (app.query_one(f"#{role}-structured", Label) for role in ("prefill", "decode"))
        return prefill.display, str(decode.render()) if decode.display else ""

    async def run() -> list[tuple[bool, str]]:
        app = FleetConsole(source, ConsoleSettings(theme="fleet-dark"))
        async with app.run_test(size=(120, 40)) as pilot:
            await loaded(pilot)
            wide = shown(app)
            await pilot.resize_terminal(80, 24)
            await pilot.pause(0.2)
            return [wide, shown(app)]

    assert asyncio.run(run()) == [(False, "structured output: 11 tool calls · 3 json object"),
                                  (False, "structured 14: 11 tools, 3 json")]
