"""Latency objectives a request must meet to count towards goodput."""

from dataclasses import dataclass

from fleetctl.engine.planner.durations import parse_latency
from fleetctl.errors import UserError
from fleetctl.options import Conversion

DEFAULT_TTFT_S = 2.0  # as `fleetctl bench`
DEFAULT_TPOT_S = 0.2


@dataclass(frozen=True)
class Slo:
    ttft_s: float = DEFAULT_TTFT_S
    tpot_s: float = DEFAULT_TPOT_S

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise UserError("SLOs must be positive seconds")

    @classmethod
    def parse(cls, ttft: str, tpot: str) -> "Slo":
        """From `--slo-ttft` and `--slo-tpot` as written ('2s', '200ms', '0.2'); raises UserError."""
        return cls(parse_latency(ttft, "--slo-ttft"), parse_latency(tpot, "--slo-tpot"))

    @classmethod
    def parse_pair(cls, text: str, what: str = "--autoplan-slo") -> "Slo":
        """'2s,200ms' (TTFT,TPOT) -> Slo; raises UserError."""
        parts = text.split(",")
        if len(parts) != 2:
            raise UserError(f"bad {what} {text!r}: use TTFT,TPOT, e.g. 2s,200ms")
        return cls(parse_latency(parts[0], f"{what} TTFT"), parse_latency(parts[1], f"{what} TPOT"))

    def met(self, ttft_s: float, tpot_s: float | None) -> bool:
        """`tpot_s` None: a one-token answer, which has no time per output token."""
        return ttft_s <= self.ttft_s and (tpot_s is None or tpot_s <= self.tpot_s)

    def describe(self) -> str:
        return f"TTFT ≤ {format_latency(self.ttft_s)}, TPOT ≤ {format_latency(self.tpot_s)}"


# `--autoplan-slo 2s,200ms`
SLO_PAIR = Conversion(str, Slo.parse_pair, lambda slo: f"{slo.ttft_s:g}s,{slo.tpot_s * 1000:g}ms")


def format_latency(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"
