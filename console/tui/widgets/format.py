"""How numbers read on the console: percentages, rates, byte counts, seconds, event times (UTC, so a
picture of the screen does not depend on where it was taken)."""

import time


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
