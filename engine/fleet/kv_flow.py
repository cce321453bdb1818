"""How prompts reached the worker that decodes them, over the last minute: the proof that a disaggregated fleet
disaggregates. A prompt is *handed off* (prefilled on a prefill worker, its KV adopted by a decode worker: by
route, with the bytes and the time each took), *prefilled locally* by a decode worker (`--local-prefill-tokens`:
it cached all but a few tokens), *colocated* (a mixed worker prefills and decodes it), or *recomputed* from its
tokens (a worker died, a handoff's KV was lost, a move was refused) — on a decode worker, that is a decode worker
prefilling again. A fleet with prefill and decode pools whose prompts mostly do not arrive by handoff is not
disaggregating, whatever its layout says (`FlowInfo.mostly_local`).

Bounded: entries older than the window are dropped on every record and read."""

import time
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from fleetctl.engine.api.status import FlowInfo, RouteInfo

FLOW_WINDOW_S = 60.0


class Arrival(StrEnum):
    HANDOFF = "handoff"
    LOCAL_PREFILL = "local prefill"
    COLOCATED = "colocated"
    RECOMPUTE = "recompute"  # on a prefill or mixed worker
    DECODE_RECOMPUTE = "decode recompute"  # a decode worker prefilled the tokens again itself


@dataclass(frozen=True)
class _Entry:
    at: float  # time.monotonic()
    arrival: Arrival
    route: tuple[str, str] | None = None  # a handoff's (prefill worker, decode worker)
    nbytes: int = 0
    seconds: float = 0.0


class KVFlow:
    def __init__(self, window_s: float = FLOW_WINDOW_S) -> None:
        self.window_s = window_s
        self._entries: deque[_Entry] = deque()

    def arrived(self, arrival: Arrival, now: float | None = None) -> None:
        self._add(_Entry(_now(now), arrival))

    def handoff(self, prefill: str, decode: str, nbytes: int, seconds: float, now: float | None = None) -> None:
        self._add(_Entry(_now(now), Arrival.HANDOFF, (prefill, decode), nbytes, seconds))

    def _add(self, entry: _Entry) -> None:
        self._entries.append(entry)
        self._forget(entry.at)

    def _forget(self, now: float) -> None:
        while self._entries and self._entries[0].at < now - self.window_s:
            self._entries.popleft()

    def summary(self, now: float | None = None) -> FlowInfo:
        """The last window's arrivals by kind and its handoff routes (busiest first)."""
        now = _now(now)
        self._forget(now)
        counts = {arrival: 0 for arrival in Arrival}
        by_route: dict[tuple[str, str], list[_Entry]] = {}
        for entry in self._entries:
            counts[entry.arrival] += 1
            if entry.route is not None:
                by_route.setdefault(entry.route, []).append(entry)
        routes = [RouteInfo(prefill=prefill, decode=decode, handoffs=len(entries),
                            bytes_per_s=round(sum(e.nbytes for e in entries) / self.window_s, 1),
                            p99_s=round(_p99([e.seconds for e in entries]), 6))
                  for (prefill, decode), entries in by_route.items()]
        routes.sort(key=lambda route: (-route.bytes_per_s, route.prefill, route.decode))
        return FlowInfo(window_s=self.window_s, handoffs=counts[Arrival.HANDOFF],
                        local_prefills=counts[Arrival.LOCAL_PREFILL], colocated=counts[Arrival.COLOCATED],
                        recomputes=counts[Arrival.RECOMPUTE] + counts[Arrival.DECODE_RECOMPUTE],
                        decode_recomputes=counts[Arrival.DECODE_RECOMPUTE], routes=routes)


def _now(now: float | None) -> float:
    return time.monotonic() if now is None else now


def _p99(values: list[float]) -> float:
    """The nearest-rank 99th percentile (the largest of fewer than 100 values)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]
