"""A one-line history chart on a fixed 0–100 % scale (Textual's Sparkline rescales to its data, which
would draw a 3 % MBU as tall as 100 %). The newest point is at the right; older points scroll off. And columns
several rows tall, for a chart with room (a request's tokens/s on its timeline)."""

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

BARS = " ▁▂▃▄▅▆▇█"


def bars(series: list[float], width: int) -> str:
    """The last `width` points of `series` (fractions of 1) as block characters, right-aligned."""
    points = series[-width:] if width > 0 else []
    levels = len(BARS) - 1
    drawn = "".join(BARS[min(levels, max(0, round(v * levels)))] if v > 0 else " " for v in points)
    return drawn.rjust(width)


def tall_bars(levels: list[float], height: int) -> list[str]:
    """`levels` (fractions of 1) as columns of block characters `height` rows tall, the top row first, to the
    nearest eighth of a row; a level above nothing shows at least the lowest eighth."""
    top = len(BARS) - 1  # eighths in a cell
    eighths = [max(1, round(v * height * top)) if v > 0 else 0 for v in levels]
    return ["".join(BARS[min(top, max(0, e - row * top))] for e in eighths) for row in reversed(range(height))]


class UsageChart(Widget):
    DEFAULT_CSS = "UsageChart { width: 1fr; height: 1; }"
    series: reactive[tuple[float, ...]] = reactive(())

    def render(self) -> Text:
        return Text(bars(list(self.series), self.size.width), style=self.rich_style)
