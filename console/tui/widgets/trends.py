"""The dashboard's trends: each pool's tokens/s and the TTFT and TPOT p50/p99 of the requests arriving in each
bucket, over the history window, one line each — a chart scaled to its own peak and the newest settled value."""

from rich.text import Text
from textual.widget import Widget

from fleetctl.console.tui.reading import NO_HISTORY, FleetReading
from fleetctl.console.tui.widgets.chart import bars
from fleetctl.console.tui.widgets.format import rate, seconds

LABEL = 14  # "prefill tok/s " and "TTFT p99      "
VALUE = 8  # "1234" tok/s, "2.49 s"
LATENCIES = (("TTFT p50", "ttft_p50"), ("TTFT p99", "ttft_p99"), ("TPOT p50", "tpot_p50"), ("TPOT p99", "tpot_p99"))


def fitted(series: list[float | None], width: int) -> list[float]:
    """`series` in at most `width` points spanning all of it — the means of runs of neighbouring buckets, the newest
    run whole, a gap (None) counting for nothing, a short series widened — over its own peak: a chart of seconds or
    tokens/s has no fixed top, unlike a utilization."""
    if width < 1:
        return []
    run = max(1, -(-len(series) // width))  # buckets per point
    points = []
    for end in range(len(series), 0, -run):
        present = [value for value in series[max(0, end - run) : end] if value is not None]
        points.append(sum(present) / len(present) if present else 0.0)
    points.reverse()
    if points:  # a short series drawn across the width: each point repeated
        points = [value for value in points for _ in range(max(1, width // len(points)))]
    peak = max(points, default=0.0)
    return [value / peak for value in points] if peak > 0 else points


def trend_rows(reading: FleetReading) -> list[tuple[str, list[float | None], str]]:
    """(label, series, newest value) per line: a pool's tokens/s, then each latency percentile."""
    if reading.history is None:
        return []
    rows = []
    for role in reading.pools:
        series = reading.pool_series(role, "tokens_per_s")
        rows.append((f"{role} tok/s", list(series), rate(series[-1]) if series else "—"))
    for label, metric in LATENCIES:
        points = reading.latency_series(metric)
        newest = next((value for value in reversed(points) if value is not None), None)
        rows.append((label, points, seconds(newest)))
    return rows


class TrendsPanel(Widget):
    def __init__(self) -> None:
        super().__init__(id="trends")
        self.border_title = "trends · 5 min"
        self.rows: list[tuple[str, list[float | None], str]] = []
        self.note = NO_HISTORY  # what it says without rows

    def show(self, reading: FleetReading) -> None:
        self.rows = trend_rows(reading)
        self.note = reading.history_note
        self.styles.height = max(1, len(self.rows)) + 2  # its border
        self.refresh()

    def render(self) -> Text:
        if not self.rows:
            return Text(self.note, style="dim")
        width = max(0, self.content_size.width - LABEL - VALUE - 1)
        theme = self.app.current_theme
        # a pool's tokens in its panel's colour (prefill primary, decode secondary), latencies in the accent
        colours = {"prefill": theme.primary, "decode": theme.secondary, "mixed": theme.secondary}
        text = Text()
        for i, (label, series, value) in enumerate(self.rows):
            text.append(f"{label:<{LABEL}}")
            text.append(bars(fitted(series, width), width), style=colours.get(label.split()[0], theme.accent) or "")
            text.append(f" {value:>{VALUE}}" + ("\n" if i < len(self.rows) - 1 else ""))
        return text
