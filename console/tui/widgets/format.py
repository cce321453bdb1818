"""How numbers read on the console: percentages, rates, byte counts, seconds, event times (UTC, so a
picture of the screen does not depend on where it was taken)."""

import time

from rich.text import Text
from textual.widgets import Static


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}" if value >= 0.1 else f"{value:.1%}"


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def count(value: int) -> str:
    """1234 -> 1.2k, 2_500_000 -> 2.5M."""
    if value < 1000:
        return str(value)
    return f"{value / 1000:.1f}k" if value < 1_000_000 else f"{value / 1_000_000:.1f}M"


def rate(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def nbytes(value: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def show_text(widget: Static, content: str | Text, layout: bool = True) -> None:
    """`widget.update(content)` only when the content changed: each update re-renders the widget and, with `layout`
    (a widget whose size follows its content), lays the screen out again — at 1 Hz that was most of the console's
    CPU."""
    if widget.content != content:
        widget.update(content, layout=layout)
