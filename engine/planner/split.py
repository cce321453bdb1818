"""A fleet's layout as the planner counts it: P prefill and D decode workers, or N mixed (colocated) — or, as
`rebalance` can reach and a switch can leave a fleet, prefill, decode and mixed workers side by side
(P:D:M). The planner ranks the first two kinds, on all of a plan's devices or (elastic) on any number of them."""

import re
from dataclasses import dataclass
from enum import StrEnum

from fleetctl.errors import UserError


class Layout(StrEnum):
    DISAGGREGATED = "disaggregated"
    COLOCATED = "colocated"
    HYBRID = "hybrid"  # mixed workers beside prefill or decode ones


@dataclass(frozen=True, order=True)
class Split:
    prefill: int = 0
    decode: int = 0
    mixed: int = 0  # workers doing both phases: alone, the colocated baseline

    def __post_init__(self) -> None:
        if min(self.prefill, self.decode, self.mixed) < 0:
            raise UserError("worker counts must be >= 0")
        if self.prefill + self.mixed < 1 or self.decode + self.mixed < 1:
            raise UserError(f"split {self.label} leaves a role empty: prompts and decoding each need >= 1 worker "
                            f"(prefill or mixed, decode or mixed)")

    @property
    def layout(self) -> Layout:
        if not self.mixed:
            return Layout.DISAGGREGATED
        return Layout.HYBRID if self.prefill or self.decode else Layout.COLOCATED

    @property
    def devices(self) -> int:
        return self.prefill + self.decode + self.mixed

    @property
    def label(self) -> str:
        return layout_label(self.prefill, self.decode, self.mixed)

    def as_json(self) -> dict[str, int | str]:
        """`{"prefill", "decode"}` (DESIGN's plan shape), plus `mixed`, `layout` and `devices`."""
        return {"prefill": self.prefill, "decode": self.decode, "mixed": self.mixed, "layout": self.layout.value,
                "devices": self.devices}


def layout_label(prefill: int, decode: int, mixed: int) -> str:
    """'2:1', 'colocated 3', or '1:1:1' (any counts: a fleet losing workers may have an empty role)."""
    if not mixed:
        return f"{prefill}:{decode}"
    return f"{prefill}:{decode}:{mixed}" if prefill or decode else f"colocated {mixed}"


def parse_split(text: str) -> Split:
    """'2:1' -> Split(prefill=2, decode=1); '1:1:1' -> one of each; 'colocated 3' (or '0:0:3') -> 3 mixed."""
    colocated = re.fullmatch(r"\s*colocated\s+(\d+)\s*", text)
    if colocated:
        return Split(mixed=int(colocated.group(1)))
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise UserError(f"bad split {text!r}: use PREFILL:DECODE, e.g. 2:1, PREFILL:DECODE:MIXED, or colocated N")
    return Split(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def splits_of(devices: int) -> list[Split]:
    """Every prefill:decode split of `devices` devices, then colocated on all of them."""
    if devices < 1:
        raise UserError("a plan needs at least one device")
    return [Split(p, devices - p) for p in range(1, devices)] + [Split(mixed=devices)]


def splits_up_to(devices: int) -> list[Split]:
    """`splits_of` every count of devices from one to `devices`: an elastic fleet's layouts."""
    return [split for n in range(1, devices + 1) for split in splits_of(n)]
