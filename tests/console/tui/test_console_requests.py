"""The requests view (`R`) on the fixture fleet: live requests first, then the finished ones, each with its
stage and workers; `s` sorts by TTFT (the request that waited 4.6 s in the queue first), `/` filters by words,
`enter` opens a request's timeline with each phase to scale and its tokens/s over its life below, `m` on a
decoding request asks where to move it and posts the move; and their pictures."""

import asyncio

import pytest
from support.console_fixture import PICTURE_IDS, PICTURE_SIZES, FixtureSource, pilot_until
from textual.widgets import DataTable, Label

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens.dialogs import ChoiceDialog, ConfirmDialog
from fleetctl.console.tui.screens.requests import RequestsScreen, short_id
from fleetctl.console.tui.screens.timeline import TimelineScreen, TokenRateChart, bar, token_rates
from fleetctl.console.tui.widgets.chart import tall_bars

WIDE = (120, 40)


def rows(screen: RequestsScreen) -> list[tuple[str, str]]:
    table = screen.query_one("#requests", DataTable)
    return [(str(table.get_row_at(i)[0]), str(table.get_row_at(i)[1])) for i in range(table.row_count)]


async def opened(pilot) -> RequestsScreen:
    app = pilot.app
    await pilot_until(pilot, lambda: app.reading.reachable, "the first reading")
    await pilot.press("R")
    await pilot_until(pilot, lambda: isinstance(app.screen, RequestsScreen) and app.screen.records, "the requests")
    await pilot.pause(0.1)
    return app.screen


def test_requests_listed_sorted_filtered_and_one_opened_and_moved() -> None:
    source = FixtureSource()

    async def run() -> dict[str, object]:
        app = FleetConsole(source, ConsoleSettings(theme="fleet-dark"))
        seen: dict[str, object] = {}
        async with app.run_test(size=WIDE) as pilot:
            screen = await opened(pilot)
            seen["by age"] = rows(screen)
            await pilot.press("s")  # by TTFT
            seen["by ttft"] = rows(screen)[3:]
            await pilot.press("slash", *"agent-7", "enter")
            seen["filtered"] = rows(screen)
            await pilot.press("slash", *["backspace"] * 7, *"tools", "enter")
            seen["held to tools"] = rows(screen)
            await pilot.press("escape")  # the filter is kept: enter closed its field; escape leaves the view
            await pilot.pause(0.1)
            screen = await opened(pilot)
            screen.query_one("#requests", DataTable).move_cursor(row=0)  # req-0020, decoding on decode-0
            await pilot.press("enter")
            await pilot_until(pilot, lambda: isinstance(app.screen, TimelineScreen), "the timeline")
            await pilot.pause(0.2)
            seen["timeline"] = str(app.screen.query_one("#timeline-summary", Label).render())
            seen["bars"] = str(app.screen.query_one("#timeline-bars", Label).render())
            seen["rate"] = str(app.screen.query_one(TokenRateChart).render())
            await pilot.press("escape")
            await pilot.press("m")
            await pilot_until(pilot, lambda: isinstance(app.screen, ChoiceDialog), "where to move it")
            await pilot.press("down", "enter")  # decode-1 is listed first: the second, decode-2
            await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
            await pilot.press("y")
            await pilot_until(pilot, lambda: source.posted, "the move posted")
        return seen

    seen = asyncio.run(run())
    assert seen["by age"] == [("req-0020", "decoding"), ("req-0021", "decoding"), ("req-0022", "queued"),
                              ("req-0017", "done"), ("req-0018", "done"), ("req-0019", "done")]
    assert [rid for rid, _ in seen["by ttft"]] == ["req-0018", "req-0017", "req-0019"]
    assert seen["filtered"] == [("req-0019", "done")]
    assert seen["held to tools"] == [("req-0020", "decoding")]
    assert "workers prefill-0 → decode-0" in seen["timeline"] and "320 of 480 prompt tokens cached" in seen["timeline"]
    assert "1.5 MB of KV handed over" in seen["timeline"]
    assert "output held to tools:required · its grammar's masks took 12 ms" in seen["timeline"]
    assert [line.split()[0] for line in seen["bars"].strip().splitlines()[:5]] == [
        "queue", "prefill", "handoff", "first", "decode"]
    rate = seen["rate"].strip().splitlines()  # its 70 tokens after the first over 5.78 s, the slowest stretch 3.8/s
    assert rate[0] == "output tokens/s from its first token to its end · mean 12.1 · peak 18.8"
    assert rate[1].startswith("tok/s             18.8  │") and rate[-2].startswith(f"{'0':>22}  │")
    assert rate[-1].split() == ["220", "ms", "6.00", "s"]
    assert len(rate) == 40 - 1 - 2 - 5 - 7 - 1  # the rows the footer, the border, the summary and the bars leave
    assert source.posted[-1] == ("/fleet/requests/req-0020/move", {"to": "decode-2"})


def test_token_rates_spread_each_bucket_over_its_time_the_last_joining_the_one_before() -> None:
    assert token_rates([2, 3, 3, 4], 1.0, 4.0, 4) == [2.0, 3.0, 3.5, 3.5]
    assert token_rates([2, 3, 3, 4], 1.0, 4.0, 8) == [2.0, 2.0, 3.0, 3.0, 3.5, 3.5, 3.5, 3.5]  # a bucket, 2 slices
    assert token_rates([2, 3, 3, 4], 1.0, 4.0, 2) == [2.5, 3.5]  # slices of two buckets
    # the last bucket cut short by the end (0.1 s of it): its token and the 10 before it over their 1.1 s
    assert token_rates([4, 10, 1], 1.0, 2.1, 3) == pytest.approx([4.0, (4 * 0.3 + 11 * 0.4 / 1.1) / 0.7, 10.0])
    assert token_rates([], 0.01, 3.0, 10) == [] == token_rates([3], 0.01, 0.0, 10)


def test_tall_bars_draw_each_level_in_eighths_of_a_row_from_the_bottom() -> None:
    assert tall_bars([1.0, 0.6, 0.0, 0.01], 2) == ["█▂  ", "██ ▁"]  # 16, 10, 0 and (at least) 1 eighth of 16
    assert tall_bars([0.75], 4) == [" ", "█", "█", "█"]


def test_a_bar_is_to_scale_and_never_empty_when_its_phase_lasted() -> None:
    assert bar(0.0, 1.0, 4.0, 40) == "█" * 10
    assert bar(2.0, 2.0, 4.0, 40) == " " * 20 + "█" * 20
    assert bar(3.99, 0.0001, 4.0, 40) == " " * 39 + "█"
    assert bar(1.0, 0.0, 4.0, 40) == " " * 10


@pytest.mark.pictures
@pytest.mark.parametrize("size", PICTURE_SIZES, ids=PICTURE_IDS)
def test_requests_picture(snap_compare, size: tuple[int, int]) -> None:
    app = FleetConsole(FixtureSource(), ConsoleSettings(theme="fleet-dark"))
    assert snap_compare(app, terminal_size=size, run_before=opened)


@pytest.mark.pictures
@pytest.mark.parametrize("size", PICTURE_SIZES, ids=PICTURE_IDS)
def test_timeline_picture(snap_compare, size: tuple[int, int]) -> None:
    async def timeline(pilot) -> None:
        screen = await opened(pilot)
        table = screen.query_one("#requests", DataTable)
        table.move_cursor(row=table.get_row_index("req-0018"))  # 4.6 s in the queue
        await pilot.press("enter")
        await pilot_until(pilot, lambda: isinstance(pilot.app.screen, TimelineScreen), "the timeline")
        await pilot.pause(0.2)

    app = FleetConsole(FixtureSource(), ConsoleSettings(theme="fleet-dark"))
    assert snap_compare(app, terminal_size=size, run_before=timeline)


def test_a_long_request_id_shows_its_start() -> None:
    assert short_id("req-0017") == "req-0017"
    assert short_id("req-ad941b438dcf424d") == "req-ad941b43…" and len(short_id("req-ad941b438dcf424d")) == 13


def test_a_poll_with_the_same_rows_updates_only_their_cells_and_keeps_the_cursor() -> None:
    async def run() -> tuple[str, int, str, bool]:
        app = FleetConsole(FixtureSource(), ConsoleSettings(theme="fleet-dark"))
        async with app.run_test(size=WIDE) as pilot:
            screen = await opened(pilot)
            table = screen.query_one("#requests", DataTable)
            table.move_cursor(row=1)
            first_row = table.rows[table.coordinate_to_cell_key((0, 0)).row_key]
            grown = screen.records["req-0021"].model_copy(update={"output_tokens": 77})
            screen.records = {**screen.records, "req-0021": grown}
            screen.show()
            kept = table.rows[table.coordinate_to_cell_key((0, 0)).row_key] is first_row  # not rebuilt
            return str(table.get_cell("req-0021", "in/hit/out")), table.cursor_row, screen.selected or "", kept

    tokens, cursor, selected, kept = asyncio.run(run())
    assert tokens.endswith("/77") and (cursor, selected) == (1, "req-0021") and kept
