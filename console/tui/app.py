"""The fleet console (Textual): the dashboard, refreshed from a FleetSource off the UI thread, and
every worker action from the keyboard or the command palette. `run_console` is the entry point."""

import asyncio
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Header, Input, OptionList, Static

from fleetctl.console.client import FleetClientError
from fleetctl.console.console_settings import ConsoleSettings
from fleetctl.console.tui.actions import ACTIONS, ACTIONS_BY_ID, READONLY_REASON
from fleetctl.console.tui.flows import ActionFlows
from fleetctl.console.tui.host import GpuSamples
from fleetctl.console.tui.palette import ActionCommands
from fleetctl.console.tui.reading import FleetReading
from fleetctl.console.tui.screens.event_detail import EventDetail
from fleetctl.console.tui.screens.filtering import FilterField
from fleetctl.console.tui.screens.help import HelpScreen
from fleetctl.console.tui.screens.logs import ALL, LogsScreen
from fleetctl.console.tui.screens.plan import PlanScreen
from fleetctl.console.tui.screens.requests import RequestsScreen
from fleetctl.console.tui.screens.worker_detail import WorkerDetail
from fleetctl.console.tui.settings import remember_theme
from fleetctl.console.tui.source import FleetSource, HttpSource
from fleetctl.console.tui.widgets.footer import FittingFooter
from fleetctl.console.tui.widgets.panels import DevicesPanel, EventsPanel, TrafficPanel
from fleetctl.console.tui.widgets.pools import PoolPanel
from fleetctl.console.tui.widgets.trends import TrendsPanel
from fleetctl.console.tui.widgets.workers import WorkersTable
from fleetctl.domain import WorkerState
from fleetctl.themes import DEFAULT_THEME, STYLESHEET
from fleetctl.themes.palettes import THEMES

NARROW_COLUMNS = 100
APP_WIDE = ("help", "theme", "quit")  # the actions every view answers to (app.check_action)
SHORT_LINES = 32  # below it (as below NARROW_COLUMNS) the devices and trends give way to the events


class FleetConsole(App[None]):
    CSS_PATH = str(STYLESHEET)
    COMMANDS = App.COMMANDS | {ActionCommands}
    # Textual sets the class on each screen as the terminal resizes (a screen takes resize events itself, so an
    # app-level handler saw only the first size)
    HORIZONTAL_BREAKPOINTS = [(0, "narrow"), (NARROW_COLUMNS, "wide")]
    VERTICAL_BREAKPOINTS = [(0, "short"), (SHORT_LINES, "tall")]
    BINDINGS = [Binding(a.keys, f"act('{a.id}')", a.label, tooltip=a.description, id=a.id,
                        show=a.id not in ("resume", "sort", "filter", "theme")) for a in ACTIONS]

    def __init__(self, source: FleetSource, settings: ConsoleSettings | None = None, *,
                 readonly: bool = False, title: str = "fleetctl", refresh: bool = True,
                 tour: Callable[[Callable[[str], None]], object] | None = None) -> None:
        super().__init__()
        self.source = source
        self.settings = settings = settings or ConsoleSettings()
        self.readonly = readonly or settings.readonly
        self.title = title
        self.sub_title = source.url + (" · read-only" if self.readonly else "")
        self.reading = FleetReading(reachable=False, error="connecting…")
        self.flows = ActionFlows(self)
        self._refresh = refresh
        self._tour = tour  # `demo --tour`: run in a thread once on screen, its announcements shown in a banner

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        with Vertical(id="banners"):  # docked under the header: in sight where a small terminal scrolls the panels
            yield Static("", id="banner")
            yield Static("", id="tour-banner")
        with Horizontal(id="top"):
            yield PoolPanel("prefill")
            yield PoolPanel("decode")
        yield WorkersTable()
        with Grid(id="lower"):  # themes/console.tcss lays it out per terminal size
            yield TrafficPanel()
            yield DevicesPanel()
            yield TrendsPanel()
            yield EventsPanel()
        yield FilterField("workers-filter")
        yield FittingFooter()

    def on_mount(self) -> None:
        # SIGTERM (a stopped `console --web`, a closed session) and SIGHUP (its terminal closed) end the console as
        # `q` does: the terminal restored, an embedded fleet stopped
        for ending in (signal.SIGTERM, signal.SIGHUP):
            asyncio.get_running_loop().add_signal_handler(ending, self.exit)
        for theme in THEMES.values():
            self.register_theme(theme)
        self.theme = self.settings.theme if self.settings.theme in THEMES else DEFAULT_THEME
        if self.settings.keys:
            self.set_keymap(self.settings.keys)
        self.query_one(WorkersTable).focus()
        if self._refresh:
            self.refresh_reading()
            self.set_interval(self.settings.interval, self.refresh_reading)
        if self._tour is not None:
            threading.Thread(target=self._tour, args=(self.announce_from_thread,), name="demo-tour",
                             daemon=True).start()

    def announce_from_thread(self, text: str) -> None:
        """A tour step's announcement, from the tour's thread: the tour banner says it until the next one."""
        if self.is_running:
            self.call_from_thread(self.announce, text)

    def announce(self, text: str) -> None:
        banner = self.query_one("#tour-banner", Static)
        banner.set_class(True, "shown")
        banner.set_class(text.startswith("failed:"), "failed")
        banner.update(f"tour · {text}")

    @work(exclusive=True, group="refresh")
    async def refresh_reading(self) -> None:
        reading = await self.source.read()
        if not self.is_running:  # the console closed while it asked: its widgets may be gone already
            return
        if self.screen is self.screen_stack[0] or isinstance(self.screen, ModalScreen):
            self.show(reading)
        else:  # a view covers the dashboard (requests, logs, plan): its widgets wait, the actions see the reading
            self.reading = reading
        if isinstance(self.screen, WorkerDetail):
            await self.refresh_detail(self.screen)

    async def refresh_detail(self, detail: WorkerDetail) -> None:
        try:
            sessions = (await self.source.sessions(detail.worker_id)).sessions
        except FleetClientError:
            sessions = None
        if self.is_running and detail is self.screen:  # not closed while the sessions were asked for
            detail.show(self.reading, sessions)

    def show(self, reading: FleetReading) -> None:
        """Render a reading; when the fleet does not answer, keep the last picture under a banner."""
        banner = self.query_one("#banner", Static)
        store = reading.status.store if reading.status else None
        banner.set_class(not reading.reachable or bool(store and store.failing), "shown")
        if not reading.reachable:
            banner.update(f"fleet unreachable: {reading.error} — retrying every {self.settings.interval:g} s")
            return
        if store and store.failing:
            banner.update(f"metrics store failing ({store.problem}): {store.kept_rows} rows kept, serving goes on · "
                          f"`fleetctl status` says why")
        self.reading = reading
        self._match_pools(list(reading.pools))
        for panel in self.query(PoolPanel):
            panel.show(reading)
        self.query_one(WorkersTable).show(reading)
        for widget in (self.query_one(TrafficPanel), self.query_one(DevicesPanel), self.query_one(TrendsPanel),
                       self.query_one(EventsPanel)):
            widget.show(reading)

    def _match_pools(self, roles: list[str]) -> None:
        """One panel per pool the fleet has (the roles it started with, and any a worker switched to)."""
        mounted = {panel.role: panel for panel in self.query(PoolPanel)}
        if set(mounted) == set(roles):
            return
        for role, panel in mounted.items():
            if role not in roles:
                panel.remove()
        top = self.query_one("#top", Horizontal)
        for role in roles:
            if role not in mounted:
                top.mount(PoolPanel(role))

    # ---- actions (key bindings, palette and help are all built from actions.ACTIONS) ----------------

    def action_act(self, action_id: str) -> None:
        action = ACTIONS_BY_ID[action_id]
        if action.changes_fleet and self.readonly:
            self.notify(READONLY_REASON, severity="warning")
            return
        worker = self.query_one(WorkersTable).selected_worker
        if action.needs_worker and worker is None:
            self.notify("select a worker first", severity="warning")
            return
        if action.changes_fleet:
            self.flows.run(action_id, worker)
            return
        match action_id:
            case "detail":
                detail = WorkerDetail(worker)
                self.push_screen(detail)
                # its sessions asked for at once: showing it without them first read as "this fleet does not
                # list sessions" until the next refresh
                detail.call_after_refresh(lambda: self.run_worker(self.refresh_detail(detail), group="detail"))
            case "plan":
                self.push_screen(PlanScreen())
            case "requests":
                self.push_screen(RequestsScreen())
            case "logs":
                chosen = self.reading.worker(worker) if worker else None
                failed = chosen is not None and chosen.state == WorkerState.FAILED.value
                self.push_screen(LogsScreen(worker if failed else ALL, [w.id for w in self.reading.workers]))
            case "filter":
                field = self.query_one("#workers-filter", Input)
                field.display = True
                field.focus()
            case "sort":
                table = self.query_one(WorkersTable)
                table.next_sort()
                table.show(self.reading)
            case "theme":
                self.theme = next(name for name in THEMES if name != self.theme)
                remember_theme(self.theme)
            case "help":
                self.push_screen(HelpScreen(self.effective_keys(), self.readonly))
            case "quit":
                self.exit()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The dashboard's actions (on its selected worker, its table) where the dashboard or that worker's detail is
        on screen; on another view (requests, logs, plan) only the app's own — help, theme, quit — as a worker action
        there would act on a row the operator cannot see (and the footer would list keys the view does not mean)."""
        if action != "act" or not parameters or len(self.screen_stack) == 1 or isinstance(self.screen, WorkerDetail):
            return True
        return parameters[0] in APP_WIDE

    def on_data_table_row_selected(self, event: WorkersTable.RowSelected) -> None:
        if isinstance(event.data_table, WorkersTable):  # enter on a worker row (the table owns the key)
            self.action_act("detail")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if isinstance(event.option_list, EventsPanel):  # enter on an event, or a click
            self.push_screen(EventDetail(event.option_list.selected_event(event.option_index)))

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "workers-filter":
            table = self.query_one(WorkersTable)
            table.words = event.value
            table.show(self.reading)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "workers-filter":
            event.input.display = False
            self.query_one(WorkersTable).focus()

    def effective_keys(self) -> dict[str, str]:
        return {action.id: self.settings.keys.get(action.id, action.keys) for action in ACTIONS}

    async def on_unmount(self) -> None:
        await self.source.close()


def run_console(url: str, *, embedded: bool = False, store: Path | None = None, readonly: bool = False,
                title: str = "fleetctl", token: str | None = None, settings: ConsoleSettings | None = None,
                gpus: GpuSamples | None = None, tour: Callable[[Callable[[str], None]], object] | None = None) -> None:
    """Attach the console to the fleet at `url` until the operator quits. `embedded` only changes the
    title (the caller owns the fleet's lifetime). The admin token defaults to $FLEET_ADMIN_TOKEN or the
    token file a local fleet wrote. `gpus` samples this host's GPUs for the devices panel; `tour` (`demo --tour`)
    runs beside it, its announcements shown in the tour banner."""
    source = HttpSource(url, token, store, gpus=gpus)
    FleetConsole(source, settings, readonly=readonly, title=title + (" · embedded fleet" if embedded else ""),
                 tour=tour).run()
