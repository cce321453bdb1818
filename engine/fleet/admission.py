"""Whether a request may enter the fleet, and why not: a request id already in flight (400), a fleet shutting
down or left without a worker of a role it needs (503), or one at capacity (429: more requests waiting to
generate than `max_queue`). Refusals for capacity are counted into one store event per BUSY_EVENT_S."""

import time

from fleetctl.domain import PHASES, EventKind
from fleetctl.engine.fleet.dispatch import Dispatcher
from fleetctl.engine.fleet.errors import FleetBusy, FleetClosing, NoWorkers, RequestIdInUse
from fleetctl.engine.fleet.state import FleetState

BUSY_EVENT_S = 5.0


class Admission:
    def __init__(self, state: FleetState, dispatcher: Dispatcher) -> None:
        self.state = state
        self.dispatcher = dispatcher
        self._refused, self._refusal_logged = 0, float("-inf")

    def check(self, request_id: str, arriving: int = 1) -> None:
        """Raises RequestIdInUse, FleetClosing, NoWorkers or FleetBusy when the request (one of `arriving`
        admitted together) may not enter."""
        state = self.state
        if request_id in state.requests:
            raise RequestIdInUse(f"request id {request_id!r} is already in flight")
        if state.closing:
            raise FleetClosing("the fleet is shutting down")
        for phase in PHASES:
            if not state.serves(phase):
                raise NoWorkers(f"no {state.phase_workers(phase)} worker is available{state.lost_nodes_note(phase)}")
        waiting = self.busy(arriving)
        if waiting is not None:
            self._record_refusal(waiting)
            raise FleetBusy(f"{waiting} requests are already waiting")

    def busy(self, arriving: int = 1) -> int | None:
        """How many requests wait to generate when `arriving` more would be past `max_queue`; None while there is
        room for them."""
        waiting = self.dispatcher.waiting()
        return waiting if waiting + arriving > self.state.config.max_queue else None

    def refused_early(self, waiting: int) -> None:
        """A request refused for capacity before it was read (the server's admission gate): counted as any 429."""
        self._record_refusal(waiting)

    def _record_refusal(self, waiting: int) -> None:
        """Count 429s; one store event per BUSY_EVENT_S says how many (a burst must not flood the store)."""
        self._refused += 1
        if time.monotonic() - self._refusal_logged >= BUSY_EVENT_S:
            self.state.record_event(EventKind.BUSY, None, {"refused": self._refused, "queued": waiting})
            self._refused, self._refusal_logged = 0, time.monotonic()
