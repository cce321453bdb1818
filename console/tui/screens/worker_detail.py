"""One worker: its live numbers, five minutes of history, and the sessions it holds."""

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Label

from fleetctl.console.tui.reading import FleetReading
from fleetctl.console.tui.widgets.chart import UsageChart
from fleetctl.console.tui.widgets.footer import FittingFooter
from fleetctl.console.tui.widgets.format import percent, rate
from fleetctl.engine.api.status import SessionInfo

CHARTS = (("busy", "busy"), ("mfu", "MFU"), ("mbu", "MBU"))


class WorkerDetail(Screen[None]):
    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "Back")]

    def __init__(self, worker_id: str) -> None:
        super().__init__()
        self.worker_id = worker_id

    def compose(self) -> ComposeResult:
        with Vertical(id="detail-charts"):
            yield Label("", id="detail-summary")
            for metric, label in CHARTS:
                with Horizontal(classes="metric-row"):
                    yield Label(label, classes="metric-label", id=f"detail-{metric}-label")
                    yield UsageChart(id=f"detail-{metric}", classes="compute" if metric == "mfu" else "bandwidth")
            yield Label("", id="detail-tokens")
        table = DataTable(id="sessions", cursor_type="row")
        table.border_title = "sessions"
        yield table
        yield FittingFooter()

    def on_mount(self) -> None:
        self.query_one("#sessions", DataTable).add_columns("request", "stage", "prompt", "output", "age")

    def show(self, reading: FleetReading, sessions: list[SessionInfo] | None) -> None:
        worker = reading.worker(self.worker_id)
        if worker is None:
            self.query_one("#detail-summary", Label).update(f"{self.worker_id}: no longer in the fleet")
            return
        weights = f" · {worker.weights}" if worker.weights else ""
        self.query_one("#detail-charts").border_title = f"{worker.id} · {worker.role} · {worker.device}{weights}"
        self.query_one("#detail-summary", Label).update(
            f"{worker.state}  pid {worker.pid or '-'}  sessions {worker.sessions}  KV {percent(worker.kv_usage)}"
            + (f" of {worker.kv_tokens:,} tokens ({worker.kv_dtype})" if worker.kv_dtype else "")
            + (f"  drafts kept {percent(worker.spec_acceptance)}, {worker.spec_tokens_per_step:.2f} tokens a step"
               if worker.spec_acceptance is not None and worker.spec_tokens_per_step is not None else ""))
        for metric, label in CHARTS:
            self.query_one(f"#detail-{metric}-label", Label).update(f"{label:<5}{percent(getattr(worker, metric)):>8}")
            series = reading.worker_series(self.worker_id, metric)
            self.query_one(f"#detail-{metric}", UsageChart).series = tuple(series)
        self.query_one("#detail-tokens", Label).update(f"tokens/s {rate(reading.tokens_per_s(self.worker_id))}")
        table = self.query_one("#sessions", DataTable)
        table.clear()
        if sessions is None:
            table.add_row("(this fleet does not list sessions)", "", "", "", "")
            return
        for s in sessions:
            table.add_row(s.id, s.stage, str(s.prompt_tokens), str(s.output_tokens), f"{s.age_s:.1f} s")
