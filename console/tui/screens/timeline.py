"""One request's timeline (from the requests view): queue → prefill → handoff → first decode → decode, each
drawn to scale against the whole request, with the workers, what the prefix cache (and the KV tiers) served,
the KV bytes its handoff moved — where a slow TTFT went — and what its output was held to (tools, a format)."""

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Label

from fleetctl.console.tui.widgets.footer import FittingFooter
from fleetctl.console.tui.widgets.format import nbytes, seconds
from fleetctl.engine.api.requests import RequestRecord

BAR = "█"


def phases(record: RequestRecord) -> list[tuple[str, float, float]]:
    """(name, start, seconds) of each phase, from the request's arrival: the handoff is the wall time from its
    KV being published to its landing; first decode is from there to the first decoded token."""
    ttft = record.queue_s + record.prefill_s
    handoff_end = ttft + record.handoff_wall_s
    first_decode_end = handoff_end + record.first_decode_s
    return [("queue", 0.0, record.queue_s), ("prefill", record.queue_s, record.prefill_s),
            ("handoff", ttft, record.handoff_wall_s), ("first decode", handoff_end, record.first_decode_s),
            ("decode", first_decode_end, max(0.0, record.e2e_s - first_decode_end))]


def bar(start: float, length: float, total: float, width: int) -> str:
    """`length` seconds from `start` as a bar on a `width`-cell line standing for `total` seconds (at least a
    cell when it lasted at all)."""
    if total <= 0 or width <= 0:
        return ""
    offset = min(width - 1, round(start / total * width))
    cells = max(1 if length > 0 else 0, round(length / total * width))
    return " " * offset + BAR * min(cells, width - offset)


def summary(record: RequestRecord) -> list[str]:
    workers = record.prefill_worker or "-"
    if record.local_prefill:
        workers, local = record.decode_worker or "-", " (it prefilled the prompt itself: no handoff)"
    else:
        local = ""
        if record.decode_worker and record.decode_worker != record.prefill_worker:
            workers += f" → {record.decode_worker}"
    tiers = ", ".join(f"{tier} tier {tokens}" for tier, tokens in record.tier_cached_tokens.items())
    cached = f"{record.prefill_cached_tokens} of {record.prompt_tokens} prompt tokens cached" + (
        f" ({tiers})" if tiers else "")
    moved = (f"{nbytes(record.handoff_bytes)} of KV handed over in {seconds(record.handoff_s)}"
             if record.handoff_bytes else "no KV handed over")
    lines = [f"{record.stage if record.stage != 'done' else record.outcome} · worker{'s' * ('→' in workers)} "
             f"{workers}{local}",
             f"TTFT {seconds(record.ttft_s)} · end to end {seconds(record.e2e_s)} · {record.output_tokens} tokens out",
             f"prefix cache: {cached}", f"handoff: {moved}"]
    if record.recomputes:
        lines.append(f"recomputed {record.recomputes}× (a worker it was on failed or moved it)")
    if record.session:
        lines.append(f"session {record.session}")
    if record.constraint:
        lines.append(f"output held to {record.constraint} · its grammar's masks took {seconds(record.mask_s)} "
                     f"beside the steps")
    return lines


class TimelineScreen(Screen[None]):
    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "Back")]

    def __init__(self, record: RequestRecord) -> None:
        super().__init__()
        self.record = record

    def compose(self) -> ComposeResult:
        with Vertical(id="timeline"):
            yield Label("\n".join(summary(self.record)), id="timeline-summary")
            yield Label("", id="timeline-bars")
        yield FittingFooter()

    def on_mount(self) -> None:
        self.query_one("#timeline", Vertical).border_title = f"request {self.record.request_id}"
        self.call_after_refresh(self.draw)

    def on_resize(self) -> None:
        self.call_after_refresh(self.draw)

    def draw(self) -> None:
        """The bars, to the width the screen has now (nothing once it is closing)."""
        try:
            label = self.query_one("#timeline-bars", Label)
            width = max(10, self.query_one("#timeline", Vertical).content_size.width - 32)
        except NoMatches:
            return
        total = self.record.e2e_s
        rows = [f"{name:<13}{seconds(length):>9}  │{bar(start, length, total, width):<{width}}│"
                for name, start, length in phases(self.record)]
        label.update("\n".join(["", *rows, f"{'':<13}{'':>9}  0{'':>{width - len(seconds(total))}}{seconds(total)}"]))
