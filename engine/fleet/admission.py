"""Whether a request may enter the fleet, and why not: a prompt the model cannot take (400), a request id already
in flight (400), a fleet shutting down or left without a worker of a role it needs (503), or one at capacity (429:
more requests waiting to generate than `max_queue`); and the entry of those it admits, queued for a prefill
worker. Refusals for capacity are counted into one store event per BUSY_EVENT_S."""

import time
import uuid

from fleetctl.domain import PHASES, EventKind
from fleetctl.engine.core.output import TextStream
from fleetctl.engine.core.prompt import check_prompt
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.dispatch import Dispatcher
from fleetctl.engine.fleet.errors import FleetBusy, FleetClosing, NoWorkers, RequestIdInUse
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.model.tokenizer import Tokenizer

BUSY_EVENT_S = 5.0


class Admission:
    def __init__(self, state: FleetState, dispatcher: Dispatcher, tokenizer: Tokenizer, vocab_size: int,
                 max_model_len: int) -> None:
        self.state = state
        self.dispatcher = dispatcher
        self.tokenizer = tokenizer
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self._refused, self._refusal_logged = 0, float("-inf")

    def admit(self, prompt_token_ids: list[int], params: SamplingParams, request_ids: list[str],
              session: str = "") -> list[TrackedRequest]:
        """One request per id ("" for a generated one), all admitted or none (raises PromptError or `check`'s
        refusals). With a seed, sample i draws with seed + i. They go to one prefill worker, which computes the
        prompt's full blocks once (the others reuse them from its prefix cache), and to one decode worker where
        they fit."""
        check_prompt(prompt_token_ids, self.vocab_size, self.max_model_len)
        eos = frozenset() if params.ignore_eos else self.tokenizer.eos_token_ids
        for request_id in request_ids:
            self.check(request_id, len(request_ids))
        siblings: list[TrackedRequest] = []
        for i, request_id in enumerate(request_ids):
            req = TrackedRequest(
                request_id=request_id or f"req-{uuid.uuid4().hex[:16]}", prompt_token_ids=list(prompt_token_ids),
                params=params, seed=params.seed + i if params.seed is not None else params.request_seed(),
                stream=TextStream(self.tokenizer, params.stop, eos), siblings=siblings, session=session,
            )
            siblings.append(req)
            self.state.requests[req.request_id] = req
            self.state.queued.append(req)
        self.dispatcher.dispatch_queued()
        return siblings

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
            raise FleetBusy(f"the fleet is busy: {waiting} requests are already waiting")

    def busy(self, arriving: int = 1) -> int | None:
        """How many requests wait to generate when `arriving` more would be past `max_queue`; None while there is
        room for them."""
        waiting = self.dispatcher.waiting()
        return waiting if waiting + arriving > self.state.config.max_queue else None

    def refuse_early(self, arriving: int) -> int | None:
        """`busy`, for a request refused before it is read (the server's admission gate): counted as any 429."""
        waiting = self.busy(arriving)
        if waiting is not None:
            self._record_refusal(waiting)
        return waiting

    def _record_refusal(self, waiting: int) -> None:
        """Count 429s; one store event per BUSY_EVENT_S says how many (a burst must not flood the store)."""
        self._refused += 1
        if time.monotonic() - self._refusal_logged >= BUSY_EVENT_S:
            self.state.record_event(EventKind.BUSY, None, {"refused": self._refused, "queued": waiting})
            self._refused, self._refusal_logged = 0, time.monotonic()
