"""One request's timeline (from the requests view): queue → prefill → handoff → first decode → decode, each
drawn to scale against the whole request, with the workers, what the prefix cache (and the KV tiers) served,
the KV bytes its handoff moved — where a slow TTFT went — and what its output was held to (tools, a format);
below, its output tokens/s from its first token to its end, as tall as the screen has room for (a handoff, a
move or a crowded batch shows as a dip)."""

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Label

from fleetctl.console.tui.widgets.chart import tall_bars
from fleetctl.console.tui.widgets.footer import FittingFooter
from fleetctl.console.tui.widgets.format import nbytes, rate, seconds
from fleetctl.engine.api.requests import RequestRecord

BAR = "█"
GUTTER = 24  # a row's name and seconds before its plot: "first decode     52 ms  "


def plot_width(content_width: int) -> int:
    """The cells a plot gets on a line of `content_width`: the gutter, its two edges and some room to their right."""
    return max(10, content_width - GUTTER - 8)


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


def token_rates(counts: list[int], bucket_s: float, span_s: float, columns: int) -> list[float]:
    """Tokens/s in each of `columns` equal slices of `span_s` seconds (its first token to its end) from `counts`
    tokens per `bucket_s` seconds: a bucket's tokens spread evenly over its time, shared by the slices it overlaps.
    The last bucket, cut short by the end (or still filling), joins the one before it: a token or two in its last
    milliseconds is no burst."""
    if columns < 1 or span_s <= 0 or bucket_s <= 0 or not counts:
        return []
    merged = [*counts[:-2], sum(counts[-2:])]
    buckets = [(i * bucket_s, (i + 1) * bucket_s, count) for i, count in enumerate(merged)]
    buckets[-1] = (buckets[-1][0], span_s, merged[-1])
    slice_s = span_s / columns
    tokens = [0.0] * columns
    for start, end, count in buckets:
        for column in range(min(columns - 1, int(start / slice_s)), min(columns - 1, int(end / slice_s)) + 1):
            overlap = min(end, (column + 1) * slice_s) - max(start, column * slice_s)
            tokens[column] += count * max(0.0, overlap) / max(end - start, 1e-9)
    return [t / slice_s for t in tokens]


class TokenRateChart(Widget):
    """The request's output tokens/s over its life after its first token, on the bars' gutter and width, its
    scale the peak slice's."""

    DEFAULT_CSS = "TokenRateChart { height: 1fr; }"

    def __init__(self, record: RequestRecord) -> None:
        super().__init__(id="timeline-rate")
        self.record = record

    def render(self) -> Text:
        record, width, height = self.record, plot_width(self.size.width), self.size.height - 3
        span = record.e2e_s - record.ttft_s
        rates = token_rates(record.token_counts, record.token_bucket_s, span, width)
        if not any(rates):
            why = f"no tokens after its first{' yet' if record.stage != 'done' else ''}"
            if record.output_tokens > 1 and not record.token_counts:  # a fleet from before the counts
                why = "the fleet sent no token times"
            return Text(f"\n{why}", style="dim")
        if height < 1:  # no room for a row
            return Text()
        peak, mean = max(rates), sum(record.token_counts) / span
        text = Text(f"\noutput tokens/s from its first token to its end · mean {rate(mean)} · peak {rate(peak)}\n")
        colour = self.app.current_theme.secondary or ""  # the decode pool's colour
        for row, drawn in enumerate(tall_bars([r / peak for r in rates], height)):
            label = ("tok/s", rate(peak)) if row == 0 else ("", "0") if row == height - 1 else ("", "")
            text.append(f"{label[0]:<13}{label[1]:>9}  │")
            text.append(drawn, style=colour)
            text.append("│\n")
        first, end = seconds(record.ttft_s), seconds(record.e2e_s)
        text.append(f"{'':<{GUTTER}}{first}{end:>{width + 2 - len(first)}}")
        return text


class TimelineScreen(Screen[None]):
    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "Back")]

    def __init__(self, record: RequestRecord) -> None:
        super().__init__()
        self.record = record

    def compose(self) -> ComposeResult:
        with Vertical(id="timeline"):
            yield Label("\n".join(summary(self.record)), id="timeline-summary")
            yield Label("", id="timeline-bars")
            yield TokenRateChart(self.record)
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
            width = plot_width(self.query_one("#timeline", Vertical).content_size.width)
        except NoMatches:
            return
        total = self.record.e2e_s
        rows = [f"{name:<13}{seconds(length):>9}  │{bar(start, length, total, width):<{width}}│"
                for name, start, length in phases(self.record)]
        label.update("\n".join(["", *rows, f"{'':<13}{'':>9}  0{'':>{width - len(seconds(total))}}{seconds(total)}"]))
