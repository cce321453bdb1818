"""The worker table: one row per worker, coloured by state, sortable, updated in place (rows keep
their keys, so the cursor stays on the worker the operator selected)."""

from rich.text import Text

from fleetctl.console.tui.reading import FleetReading
from fleetctl.console.tui.widgets.format import percent, rate
from fleetctl.console.tui.widgets.line_table import LineTable
from fleetctl.engine.api.status import WorkerInfo

# the weight and KV formats last: at 80 columns the live figures come first
COLUMNS = ("worker", "role", "device", "state", "sessions", "KV", "busy", "MFU", "MBU", "tok/s", "weights",
           "KV format")
ROLE_ORDER = {"prefill": 0, "decode": 1, "mixed": 2}
STATE_STYLES = {"running": "green", "starting": "cyan", "draining": "yellow", "checkpointed": "blue",
                "stopped": "dim", "failed": "bold red"}


def device_cell(worker: WorkerInfo) -> Text | str:
    """The device, with its Ray node when the name does not already say it, and whether that node was lost."""
    device, node = worker.device, worker.node
    if node and not device.startswith(f"{node}/"):
        device = f"{node}/{device}"
    return Text(f"{device} (node lost)", style="bold red") if worker.node_lost else device


def state_cell(worker: WorkerInfo) -> Text:
    """Its state; a stalled worker (holding work, no step for many times its step time) in red, with how long."""
    style = "bold red" if worker.stalled_s is not None else STATE_STYLES.get(worker.state, "")
    return Text(worker.shown_state, style=style)


def cells(worker: WorkerInfo, reading: FleetReading) -> tuple[Text | str, ...]:
    state = state_cell(worker)
    return (Text(worker.id, style=state.style), worker.role, device_cell(worker), state,
            str(worker.sessions), percent(worker.kv_usage), percent(worker.busy), percent(worker.mfu),
            percent(worker.mbu), rate(reading.tokens_per_s(worker.id)), worker.weights or "-", worker.kv_dtype or "-")


def same(shown: object, value: Text | str) -> bool:
    """Whether a cell already shows `value` (Rich's Text equality ignores its style: a worker's id is styled by
    its state)."""
    if isinstance(value, Text) and isinstance(shown, Text):
        return (shown.plain, shown.style, shown.spans) == (value.plain, value.style, value.spans)
    return shown == value


def sort_value(worker: WorkerInfo, column: str, reading: FleetReading) -> tuple[str | int | float, int, str]:
    values: dict[str, str | int | float] = {
        "worker": worker.id, "role": ROLE_ORDER.get(worker.role, 9), "device": worker.device,
        "weights": worker.weights or "", "KV format": worker.kv_dtype or "", "state": worker.state,
        "sessions": -worker.sessions, "KV": -worker.kv_usage, "busy": -worker.busy, "MFU": -worker.mfu,
        "MBU": -worker.mbu, "tok/s": -reading.tokens_per_s(worker.id)}
    return values[column], ROLE_ORDER.get(worker.role, 9), worker.id


def matches(worker: WorkerInfo, reading: FleetReading, words: str) -> bool:
    line = " ".join(str(cell) for cell in cells(worker, reading)).lower()
    return all(word in line for word in words.lower().split())


class WorkersTable(LineTable):
    def __init__(self) -> None:
        super().__init__(id="workers", zebra_stripes=True)
        self.border_title = "workers"
        self.sort_column = "role"
        self.words = ""  # the filter: only rows whose cells hold every word (any case)

    def on_mount(self) -> None:
        for column in COLUMNS:
            self.add_column(column, key=column)

    @property
    def selected_worker(self) -> str | None:
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def next_sort(self) -> str:
        self.sort_column = COLUMNS[(COLUMNS.index(self.sort_column) + 1) % len(COLUMNS)]
        return self.sort_column

    def show(self, reading: FleetReading) -> None:
        selected = self.selected_worker
        workers = sorted((w for w in reading.workers if matches(w, reading, self.words)),
                         key=lambda w: sort_value(w, self.sort_column, reading))
        sorted_by = f" · sorted by {self.sort_column}" if self.sort_column != "role" else ""
        filtered = f" · filter: {self.words} ({len(workers)} of {len(reading.workers)})" if self.words else ""
        self.border_title = f"workers{sorted_by}{filtered}"
        wanted = [w.id for w in workers]
        present = [key.value for key in self.rows]
        if present != wanted:  # rows came, went or moved: rebuild, keeping the selection
            self.clear()
            for worker in workers:
                self.add_row(*cells(worker, reading), key=worker.id)
            if selected in wanted:
                self.move_cursor(row=wanted.index(selected))
            return
        for worker in workers:
            for column, value in zip(COLUMNS, cells(worker, reading), strict=True):
                if not same(self.get_cell(worker.id, column), value):  # an update re-renders every visible cell
                    self.update_cell(worker.id, column, value, update_width=True)  # a state may outgrow its column
