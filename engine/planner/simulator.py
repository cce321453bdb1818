"""A small discrete-event replay of requests through one layout, with the fleet's own rules:

- a prompt goes to the prompt worker (prefill, or mixed) holding the fewest requests;
- a prefill worker runs what waits in one step (up to the token budget); each prompt's first token
  comes at the step's end, then its KV takes the handoff time to reach the decode worker holding the
  fewest requests that has room (a full batch: it waits for one);
- a decode worker steps all its sequences together, one token each (continuous batching); a sequence
  that arrives joins at the next step;
- a mixed worker runs a prefill step whenever prompts wait and its batch has room, else a decode step
  (the engine's scheduler: prefill first);
- a request measured as a local prefill (conditional disaggregation: its decode worker had most of its prompt
  cached) goes, in a split, to the decode worker holding the fewest requests, which prefills it like a
  mixed worker and keeps it (no handoff); prefill steps cost the computed tokens (the prompt less what the
  prefix cache served when measured).

Step times come from the fitted cost models. Not modelled: KV pool capacity and preemption, the
controller's queue limit, retries — the fleet's limits on what runs at once are the batch size and the
token budget."""

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from fleetctl.domain import WorkerRole
from fleetctl.engine.planner.costs import DeviceCosts
from fleetctl.engine.planner.split import Split


@dataclass(frozen=True)
class SimRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0  # served by the prefix cache: its prefill computes the rest
    local: bool = False  # in a split, prefilled on a decode worker with no handoff (as it was when measured)

    def __post_init__(self) -> None:
        if self.arrival_s < 0 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("a request arrives at >= 0 s with >= 1 prompt and >= 1 output token")
        if not 0 <= self.cached_tokens < self.prompt_tokens:
            raise ValueError("a request's cached tokens are fewer than its prompt tokens")

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class EngineLimits:
    max_num_seqs: int = 64  # as EngineSettings
    max_num_batched_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("engine limits must be positive")


@dataclass(frozen=True)
class Timing:
    arrival_s: float
    ttft_s: float
    tpot_s: float | None  # None for a one-token answer
    e2e_s: float


class _Event(StrEnum):
    ARRIVE = "arrive"  # index: the request
    HANDED = "handed"  # index: the request; its KV reached the decode side (payload: its prefill worker)
    KICK = "kick"  # index: the worker; start a step if it is idle (after every event of the same instant)
    PREFILL = "prefill"  # index: the worker; payload: the batch of requests
    DECODE = "decode"


@dataclass
class _Worker:
    role: WorkerRole
    waiting: deque[int] = field(default_factory=deque)  # prompts
    running: list[int] = field(default_factory=list)  # sequences decoding here
    held: int = 0  # requests routed here and not yet gone (the router's load measure)
    busy: bool = False


class _Replay:
    def __init__(self, requests: Sequence[SimRequest], split: Split, costs: DeviceCosts,
                 limits: EngineLimits) -> None:
        self.requests, self.costs, self.limits = requests, costs, limits
        roles = ([WorkerRole.MIXED] * split.mixed if split.mixed
                 else [WorkerRole.PREFILL] * split.prefill + [WorkerRole.DECODE] * split.decode)
        self.workers = [_Worker(role) for role in roles]
        self.prompt_role = WorkerRole.MIXED if split.mixed else WorkerRole.PREFILL
        self.tokens = [0] * len(requests)
        self.first = [0.0] * len(requests)
        self.finish = [0.0] * len(requests)
        self.pending: deque[int] = deque()  # handed-off sequences no decode worker has room for
        self.events: list[tuple[float, int, _Event, int, object]] = []
        self.order = itertools.count()  # ties run in the order they were scheduled

    def run(self) -> list[Timing]:
        for i, req in enumerate(self.requests):
            self._at(req.arrival_s, _Event.ARRIVE, i)
        while self.events:
            now, _, event, index, payload = heapq.heappop(self.events)
            if event is _Event.ARRIVE:
                self._arrive(now, index)
            elif event is _Event.KICK:
                self._start(now, index)
            elif event is _Event.HANDED:
                assert isinstance(payload, int)
                self.workers[payload].held -= 1  # the decode side acknowledged: the prefill copy is freed
                self.pending.append(index)
                self._place_pending(now)
            else:
                assert isinstance(payload, list)
                self._step_done(now, index, event, payload)
        return [self._timing(i) for i in range(len(self.requests))]

    def _at(self, when: float, event: _Event, index: int, payload: object = None) -> None:
        heapq.heappush(self.events, (when, next(self.order), event, index, payload))

    def _least_held(self, role: WorkerRole, limit: float = float("inf")) -> int | None:
        """The worker of `role` holding the fewest requests (fewer than `limit`), lowest index first."""
        candidates = [i for i, w in enumerate(self.workers) if w.role is role and w.held < limit]
        return min(candidates, key=lambda i: self.workers[i].held, default=None)

    def _arrive(self, now: float, i: int) -> None:
        local = self.requests[i].local and self.prompt_role is WorkerRole.PREFILL
        index = self._least_held(WorkerRole.DECODE if local else self.prompt_role)
        assert index is not None  # every layout has a prompt role (and a split has decode workers)
        self.workers[index].waiting.append(i)
        self.workers[index].held += 1
        self._at(now, _Event.KICK, index)  # prompts arriving at the same instant share its step

    def _place_pending(self, now: float) -> None:
        while self.pending:
            index = self._least_held(WorkerRole.DECODE, limit=self.limits.max_num_seqs)
            if index is None:
                return
            self.workers[index].running.append(self.pending.popleft())
            self.workers[index].held += 1
            self._at(now, _Event.KICK, index)

    def _start(self, now: float, index: int) -> None:
        worker = self.workers[index]
        if worker.busy:
            return
        if worker.waiting and len(worker.running) < self.limits.max_num_seqs:
            batch, budget = [], self.limits.max_num_batched_tokens
            while worker.waiting and len(worker.running) + len(batch) < self.limits.max_num_seqs:
                prompt = self.requests[worker.waiting[0]].computed_tokens
                if batch and prompt > budget:
                    break
                batch.append(worker.waiting.popleft())
                budget -= prompt
            worker.busy = True
            self._at(now + self.costs.prefill_s([self.requests[i].computed_tokens for i in batch]), _Event.PREFILL,
                     index, batch)
        elif worker.running:
            batch = list(worker.running)
            context = sum(self.requests[i].prompt_tokens + self.tokens[i] for i in batch)
            worker.busy = True
            self._at(now + self.costs.decode_s(len(batch), context), _Event.DECODE, index, batch)

    def _step_done(self, now: float, index: int, event: _Event, batch: list[int]) -> None:
        worker = self.workers[index]
        worker.busy = False
        for i in batch:
            self.tokens[i] += 1
            if event is _Event.PREFILL:
                self.first[i] = now
            if self.tokens[i] >= self.requests[i].output_tokens:
                self.finish[i] = now
                worker.held -= 1
                if event is _Event.DECODE:
                    worker.running.remove(i)
            elif event is _Event.PREFILL and worker.role is not WorkerRole.PREFILL:  # mixed, or a local prefill
                worker.running.append(i)
            elif event is _Event.PREFILL:
                self._at(now + self.costs.handoff_s(self.requests[i].prompt_tokens), _Event.HANDED, i, index)
        self._place_pending(now)
        self._start(now, index)

    def _timing(self, i: int) -> Timing:
        req = self.requests[i]
        tpot = (self.finish[i] - self.first[i]) / (req.output_tokens - 1) if req.output_tokens > 1 else None
        return Timing(req.arrival_s, self.first[i] - req.arrival_s, tpot, self.finish[i] - req.arrival_s)


def simulate(requests: Sequence[SimRequest], split: Split, costs: DeviceCosts,
             limits: EngineLimits = EngineLimits()) -> list[Timing]:
    """Each request's timing when `requests` arrive at a fleet laid out as `split` on devices costed as `costs`."""
    return _Replay(requests, split, costs, limits).run()
