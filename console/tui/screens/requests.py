"""`R`: the requests in flight and those that finished last (`GET /fleet/requests`): stage, workers, prompt /
cached (hit) / output tokens, age and TTFT (once there is a first token), refreshed every interval; `s` sorts by the
next column, `/` filters by words, `enter` opens a request's timeline, `m` moves a decoding session to another
worker live. A request held to tools or a format is found by filtering for it (`tools`, `json_schema`)."""

from contextlib import suppress

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable

from fleetctl.console.client import FleetClientError
from fleetctl.console.tui.actions import READONLY_REASON
from fleetctl.console.tui.screens.filtering import FilterField, Filtering
from fleetctl.console.tui.screens.timeline import TimelineScreen
from fleetctl.console.tui.widgets.footer import FittingFooter
from fleetctl.console.tui.widgets.format import seconds
from fleetctl.console.tui.widgets.line_table import LineTable
from fleetctl.engine.api.requests import RequestRecord

RECENT = 200  # finished requests listed under the live ones
COLUMNS = ("request", "stage", "prefill", "decode", "in/hit/out", "age", "TTFT")
ID_WIDTH = 13  # a longer request id (a server-made one is 20 characters) shows its start and "…": 80 columns fit
SORTS = ("age", "TTFT", "prompt", "output")  # `s` steps through them, largest first


def stage_of(record: RequestRecord) -> str:
    """A live request's stage, or how a finished one ended (done: its last token or a stop string)."""
    if record.stage == "done":
        return "done" if record.outcome in ("stop", "length") else record.outcome
    return {"prefill": "prefilling", "handoff": "handing off", "decode": "decoding"}.get(record.stage, record.stage)


def sort_value(record: RequestRecord, column: str, now: float) -> float:
    return {"age": now - record.arrival, "TTFT": record.ttft_s if record.output_tokens else 0.0,
            "prompt": record.prompt_tokens, "output": record.output_tokens}[column]


def cells(record: RequestRecord, now: float) -> tuple[str, ...]:
    tokens = f"{record.prompt_tokens}/{record.prefill_cached_tokens}/{record.output_tokens}"
    prefill = record.prefill_worker or ("local" if record.local_prefill else "-")  # its decode worker prefilled it
    return (short_id(record.request_id), stage_of(record), prefill, record.decode_worker or "-", tokens,
            seconds(now - record.arrival), seconds(record.ttft_s) if record.output_tokens else "-")


def short_id(request_id: str) -> str:
    return request_id if len(request_id) <= ID_WIDTH else request_id[:ID_WIDTH - 1] + "…"


def matches(record: RequestRecord, words: str, now: float) -> bool:
    if not words:
        return True
    extra = f" {record.request_id} {record.session} {record.constraint}"
    haystack = " ".join(cells(record, now)).lower() + extra.lower()
    return all(word in haystack for word in words.lower().split())


class RequestsScreen(Filtering, Screen[None]):
    BINDINGS = [Binding("escape,backspace", "back", "Back"),
                Binding("enter", "timeline", "timeline"),
                Binding("m", "move", "move session"),
                Binding("s", "sort", "sort"),
                Binding("slash", "filter", "filter")]

    filter_field, content = "requests-filter", "requests"

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, RequestRecord] = {}
        self.sort = SORTS[0]
        self.words = ""
        self.now = 0.0  # the fleet's now as its answer says (a live request's end is then): ages on its clock
        self.shown: dict[str, tuple[str, ...]] = {}  # each row's cells as last drawn

    def compose(self) -> ComposeResult:
        table = LineTable(id="requests", zebra_stripes=True)
        yield table
        yield FilterField("requests-filter")
        yield FittingFooter()

    def on_mount(self) -> None:
        table = self.query_one("#requests", DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column)
        self._title()
        self.poll()
        self.set_interval(self.app.settings.interval, self.poll)

    def _title(self) -> None:
        filtered = f" · filter: {self.words}" if self.words else ""
        self.query_one("#requests", DataTable).border_title = f"requests · by {self.sort}{filtered}"

    @work(exclusive=True, group="requests")
    async def poll(self) -> None:
        try:
            answer = await self.app.source.requests(RECENT)
        except FleetClientError as exc:
            answer, problem = None, f"no requests: {exc}"
        with suppress(NoMatches):  # the screen closed (or the app quits) while it asked: nothing to show
            if answer is None:
                self.query_one("#requests", DataTable).border_subtitle = problem
                return
            self.records = {r.request_id: r for r in [*answer.requests, *answer.live]}
            self.now = max([self.now, *(r.arrival + r.e2e_s for r in self.records.values())])
            self.show()

    def show(self) -> None:
        table = self.query_one("#requests", DataTable)
        shown = [r for r in self.records.values() if matches(r, self.words, self.now)]
        live = sorted((r for r in shown if r.stage != "done"), key=lambda r: -sort_value(r, self.sort, self.now))
        done = sorted((r for r in shown if r.stage == "done"), key=lambda r: -sort_value(r, self.sort, self.now))
        rows = {record.request_id: cells(record, self.now) for record in [*live, *done]}
        if [key.value for key in table.rows] == list(rows):  # the same rows in the same order: only what changed
            for key, values in rows.items():
                for column, value, was in zip(COLUMNS, values, self.shown.get(key, ()), strict=False):
                    if value != was:
                        table.update_cell(key, column, value)
        else:
            selected = self.selected
            table.clear()
            for key, values in rows.items():
                table.add_row(*values, key=key)
            if selected in rows:
                table.move_cursor(row=table.get_row_index(selected))
        self.shown = rows
        table.border_subtitle = f"{len(live)} in flight, {len(done)} finished"
        self._title()

    @property
    def selected(self) -> str | None:
        table = self.query_one("#requests", DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def action_timeline(self) -> None:
        if self.selected is not None:
            self.app.push_screen(TimelineScreen(self.records[self.selected]))

    def on_data_table_row_selected(self, _: DataTable.RowSelected) -> None:
        self.action_timeline()

    def action_move(self) -> None:
        record = self.records.get(self.selected or "")
        if record is None or record.stage != "decode" or record.decode_worker is None:
            self.notify("select a decoding request first", severity="warning")
            return
        if self.app.readonly:
            self.notify(READONLY_REASON, severity="warning")
            return
        self.app.flows.launch("move", self.app.flows.move(record.request_id, record.decode_worker))

    def apply_filter(self) -> None:
        self.show()

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.show()
