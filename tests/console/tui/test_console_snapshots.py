"""Pictures of the console (pytest-textual-snapshot) on a deterministic fixture fleet: the dashboard
at 120×40, 80×24 and 200×60, both themes, read-only, help (at 120×40 and 80×24), a worker's detail, an event's
details, the migrate dialog with its progress bar, the switch and rebalance dialogs, the plan screen and the tour
banner (at 120×40, 80×24 and 200×60); and the 80-column layout following a live resize. Update them with
`pytest tests/console --snapshot-update` after a deliberate change."""

import asyncio

import pytest
from support.console_fixture import (
    NOW,
    PICTURE_IDS,
    PICTURE_SIZES,
    SESSIONS,
    FixtureSource,
    footer_fitted,
    pilot_until,
)
from textual.widgets import DataTable, Static

from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.app import FleetConsole
from fleetctl.console.tui.screens.event_detail import EventDetail
from fleetctl.console.tui.screens.worker_detail import WorkerDetail
from fleetctl.console.tui.widgets.panels import DevicesPanel, EventsPanel
from fleetctl.engine.api.status import StoreInfo

pytestmark = pytest.mark.pictures
WIDE, NARROW, LARGE = (120, 40), (80, 24), (200, 60)


def console(source: FixtureSource | None = None, **settings: object) -> FleetConsole:
    return FleetConsole(source or FixtureSource(), ConsoleSettings(theme="fleet-dark", **settings))


async def loaded(pilot) -> None:
    """Wait until the first reading is on screen (and the footer holds the keys that fit)."""
    await pilot_until(pilot, lambda: pilot.app.reading.reachable, "the first reading")
    await pilot_until(pilot, lambda: footer_fitted(pilot.app), "the footer fitted")
    await pilot.pause(0.1)


def test_dashboard(snap_compare) -> None:
    assert snap_compare(console(), terminal_size=WIDE, run_before=loaded)


def test_dashboard_at_80x24(snap_compare) -> None:
    assert snap_compare(console(), terminal_size=NARROW, run_before=loaded)


def test_dashboard_at_200x60(snap_compare) -> None:
    assert snap_compare(console(), terminal_size=LARGE, run_before=loaded)


def test_resizing_the_terminal_gives_the_narrow_layout_and_back() -> None:
    """The 80-column layout (no devices panel) follows a live resize, not only the size the console started at."""
    async def run() -> list[tuple[bool, bool]]:
        app = console()
        async with app.run_test(size=WIDE) as pilot:
            await loaded(pilot)
            shown = []
            for size in (NARROW, WIDE):
                shown.append((app.query_one(DevicesPanel).display, app.query_one(EventsPanel).display))
                await pilot.resize_terminal(*size)
                await pilot.pause(0.1)
            shown.append((app.query_one(DevicesPanel).display, app.query_one(EventsPanel).display))
            return shown

    assert asyncio.run(run()) == [(True, True), (False, True), (True, True)]


def test_dashboard_light_theme(snap_compare) -> None:
    app = FleetConsole(FixtureSource(), ConsoleSettings(theme="fleet-light"))
    assert snap_compare(app, terminal_size=WIDE, run_before=loaded)


def test_readonly_dashboard(snap_compare) -> None:
    assert snap_compare(console(readonly=True), terminal_size=WIDE, run_before=loaded)


def test_unreachable_fleet_banner(snap_compare) -> None:
    async def unreachable(pilot) -> None:
        await pilot.pause(0.3)
        await pilot_until(pilot, lambda: footer_fitted(pilot.app), "the footer fitted")

    assert snap_compare(console(FixtureSource(reachable=False)), terminal_size=NARROW, run_before=unreachable)


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
def test_dashboard_with_kv_tiers(snap_compare, size: tuple[int, int]) -> None:
    """A fleet with a host tier over a disk tier: each pool panel has a line of what each tier read back for
    it and how full each tier is, in words that fit the panel."""
    assert snap_compare(console(FixtureSource(tiers=True)), terminal_size=size, run_before=loaded)


def test_failing_store_banner(snap_compare) -> None:
    """The fleet answers but its metrics store refuses writes: the banner says so over a live dashboard."""
    path = "/home/op/.local/share/fleetctl/fleet.db"
    failing = StoreInfo(path=path, failing=True, kept_rows=1840, problem="disk full", failing_since=NOW - 95,
                        error=f"the store {path} cannot be written: its disk is full (0.0 MiB free): free some space, "
                              f"or give another file with --store")
    assert snap_compare(console(FixtureSource(store=failing)), terminal_size=NARROW, run_before=loaded)


@pytest.mark.parametrize("size", PICTURE_SIZES, ids=PICTURE_IDS)
def test_help(snap_compare, size: tuple[int, int]) -> None:
    """Every key; a description longer than the dialog wraps at words."""
    async def open_help(pilot) -> None:
        await loaded(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.2)

    assert snap_compare(console(), terminal_size=size, run_before=open_help)


@pytest.mark.parametrize("size", PICTURE_SIZES, ids=PICTURE_IDS)
def test_event_detail(snap_compare, size: tuple[int, int]) -> None:
    async def open_event(pilot) -> None:
        await loaded(pilot)
        await pilot.press("tab", "end", "enter")  # the events, the newest, its details
        await pilot_until(pilot, lambda: isinstance(pilot.app.screen, EventDetail), "the event's details")
        await pilot.pause(0.1)

    assert snap_compare(console(), terminal_size=size, run_before=open_event)


def test_worker_detail(snap_compare) -> None:
    async def open_detail(pilot) -> None:
        await loaded(pilot)
        await pilot.press("down", "down", "enter")
        await pilot_until(pilot, lambda: isinstance(screen := pilot.app.screen, WorkerDetail)
                          and screen.query_one("#sessions", DataTable).row_count == len(SESSIONS),
                          "the worker's sessions")
        await pilot.pause(0.2)
        await pilot.pause()  # and until the app is idle: the new screen's footer is laid out after its table

    assert snap_compare(console(), terminal_size=WIDE, run_before=open_detail)


def test_migrate_dialog_with_progress(snap_compare) -> None:
    async def migrate(pilot) -> None:
        await loaded(pilot)
        await pilot.press("down", "down", "m")
        await pilot.pause(0.2)
        await pilot.press("enter")  # the first free device
        await pilot.pause(0.2)
        await pilot.press("y")
        for _ in range(20):
            await pilot.pause(0.05)

    assert snap_compare(console(FixtureSource(hold_at=1)), terminal_size=WIDE, run_before=migrate)


@pytest.mark.parametrize("size", PICTURE_SIZES, ids=PICTURE_IDS)
def test_plan_screen(snap_compare, size: tuple[int, int]) -> None:
    """The split regret and the plan's advice in the same words, the bands, the latency bars against the SLOs."""
    async def open_plan(pilot) -> None:
        await loaded(pilot)
        await pilot.press("p")
        for _ in range(20):
            await pilot.pause(0.05)

    assert snap_compare(console(), terminal_size=size, run_before=open_plan)


@pytest.mark.parametrize("key", ["w", "b"], ids=["switch", "rebalance"])
@pytest.mark.parametrize("size", PICTURE_SIZES, ids=PICTURE_IDS)
def test_switch_and_rebalance_dialogs(snap_compare, size: tuple[int, int], key: str) -> None:
    """`w` on decode-0: the roles it can take, each with what it does; `b`: the split regret's best or a typed one."""
    async def open_dialog(pilot) -> None:
        await loaded(pilot)
        await pilot.press("down", "down", key)
        for _ in range(10):
            await pilot.pause(0.05)

    assert snap_compare(console(), terminal_size=size, run_before=open_dialog)


def tour_of(*texts: str):
    """A tour that announces `texts` at once (`demo --tour`'s announcements, from its thread)."""
    def tour(announce) -> None:
        for text in texts:
            announce(text)
    return tour


TOUR_STEP = ("Live migration: decode-0 moves from cpu:2 to cpu:8 while it decodes — its 12 streams go on, "
             "each paused for about one step")


@pytest.mark.parametrize("size", PICTURE_SIZES, ids=PICTURE_IDS)
def test_tour_banner(snap_compare, size: tuple[int, int]) -> None:
    """`demo --tour`: the step under way in a banner under the title, over the panels that show its effect."""
    async def announced(pilot) -> None:
        await loaded(pilot)
        await pilot_until(pilot, lambda: pilot.app.query_one("#tour-banner").has_class("shown"), "the banner")
        await pilot.pause(0.1)

    app = FleetConsole(FixtureSource(), ConsoleSettings(theme="fleet-dark"), tour=tour_of(TOUR_STEP))
    assert snap_compare(app, terminal_size=size, run_before=announced)


def test_a_failed_tour_step_turns_the_banner_red() -> None:
    async def run() -> tuple[str, bool]:
        app = FleetConsole(FixtureSource(), ConsoleSettings(), tour=tour_of(TOUR_STEP, "failed: no free device"))
        async with app.run_test(size=WIDE) as pilot:
            banner = app.query_one("#tour-banner", Static)
            await pilot_until(pilot, lambda: banner.has_class("failed"), "the failed step")
            return str(banner.render()), banner.display

    text, shown = asyncio.run(run())
    assert text == "tour · failed: no free device" and shown
