"""Durations as an operator writes them: a window (`90s`, `10m`, `2h`, `1d`) and a latency (`2s`,
`200ms`, `0.2`), each to seconds."""

import re

from fleetctl.errors import UserError

_WINDOW = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
_LATENCY = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?\s*")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: str, what: str = "--since") -> float:
    """'90s', '10m', '2h', '1d' or plain seconds -> seconds."""
    match = _WINDOW.fullmatch(text)
    value = float(match.group(1)) * _UNITS[match.group(2)] if match else 0.0
    if value <= 0:
        raise UserError(f"bad {what} {text!r}: use e.g. 90s, 10m, 2h, 1d")
    return value


def parse_latency(text: str, what: str = "SLO") -> float:
    """'2s', '200ms', '0.2' (seconds) -> seconds."""
    match = _LATENCY.fullmatch(text)
    value = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1) if match else 0.0
    if value <= 0:
        raise UserError(f"bad {what} {text!r}: use e.g. 2s, 200ms or 0.2 (seconds, > 0)")
    return value


def format_window(seconds: float) -> str:
    """600 -> '10m', 7200 -> '2h', 90 -> '90s' (as `parse_window` reads it)."""
    for unit in ("d", "h", "m"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{seconds / _UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"
