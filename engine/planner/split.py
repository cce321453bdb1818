"""A fleet's layout as the planner counts it: P prefill and D decode workers, or N mixed (colocated)."""

import re
from dataclasses import dataclass
from enum import StrEnum


class Layout(StrEnum):
    DISAGGREGATED = "disaggregated"
    COLOCATED = "colocated"


class SplitError(ValueError):
    """A split that cannot be parsed or built; the message is one line for the user."""


@dataclass(frozen=True, order=True)
class Split:
    prefill: int = 0
    decode: int = 0
    mixed: int = 0  # > 0: colocated, and prefill == decode == 0

    def __post_init__(self) -> None:
        if min(self.prefill, self.decode, self.mixed) < 0:
            raise SplitError("worker counts must be >= 0")
        if self.mixed and (self.prefill or self.decode):
            raise SplitError("a split is either prefill:decode or colocated, not both")
        if not self.mixed and (self.prefill < 1 or self.decode < 1):
            raise SplitError(f"split {self.prefill}:{self.decode} leaves a role empty: both need >= 1 worker")

    @property
    def layout(self) -> Layout:
        return Layout.COLOCATED if self.mixed else Layout.DISAGGREGATED

    @property
    def devices(self) -> int:
        return self.mixed or self.prefill + self.decode

    @property
    def label(self) -> str:
        return f"colocated {self.mixed}" if self.mixed else f"{self.prefill}:{self.decode}"

    def as_json(self) -> dict[str, int | str]:
        """`{"prefill", "decode"}` (DESIGN's plan shape), plus `mixed` and `layout`."""
        return {"prefill": self.prefill, "decode": self.decode, "mixed": self.mixed, "layout": self.layout.value}


def parse_split(text: str) -> Split:
    """'2:1' -> Split(prefill=2, decode=1)."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not match:
        raise SplitError(f"bad split {text!r}: use PREFILL:DECODE, e.g. 2:1")
    return Split(int(match.group(1)), int(match.group(2)))


def splits_of(devices: int) -> list[Split]:
    """Every prefill:decode split of `devices` devices, then colocated on all of them."""
    if devices < 1:
        raise SplitError("a plan needs at least one device")
    return [Split(p, devices - p) for p in range(1, devices)] + [Split(mixed=devices)]
