"""A request as the fleet controller follows it: stage, where it lives, its text stream, its
client-facing event queue, and its timing breakdown."""

import asyncio
import time
from dataclasses import dataclass, field
from enum import Enum

from fleetctl.engine.core.output import TextStream, TokenLogprobs
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.token_buckets import TokenBuckets
from fleetctl.engine.worker.protocol import KVHandle


class RequestStage(Enum):
    QUEUED = "queued"  # waiting in the controller for a prefill (or mixed) worker
    PREFILL = "prefill"  # on a prefill (or mixed / recomputing decode) worker
    HANDOFF = "handoff"  # KV published by the prefill worker, waiting for / moving to a decode worker
    DECODE = "decode"
    DONE = "done"


@dataclass(frozen=True)
class StreamEvent:
    """What a client receives: a text delta with its token (and the token's logprobs, when asked for),
    or the end (reason or error)."""

    token_id: int | None = None
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    logprobs: TokenLogprobs | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass
class RequestTimes:
    """Seconds since the epoch (time.time()) at each transition; None until it happens."""

    arrival: float = field(default_factory=time.time)
    prefill_start: float | None = None  # when the first model step that computed its prompt began
    first_token: float | None = None
    second_token: float | None = None  # the first token from decode (after the handoff, if any)
    handoff_start: float | None = None
    handoff_end: float | None = None
    finished: float | None = None
    handoff_bytes: int = 0
    handoff_seconds: float = 0.0  # publish + fetch/copy, measured inside the workers


@dataclass(frozen=True)
class RequestMove:
    """A live move of a request's session: its stall, the last token from the source to the first from the
    destination (time.time())."""

    source: str
    dest: str
    start: float
    end: float
    nbytes: int  # KV sent


@dataclass(eq=False)
class TrackedRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    stream: TextStream
    events: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)
    output_token_ids: list[int] = field(default_factory=list)
    stage: RequestStage = RequestStage.QUEUED
    prefill_worker: str | None = None  # the worker running its prefill (or all of it, when mixed)
    decode_worker: str | None = None
    handle: KVHandle | None = None  # published KV awaiting (or in) handoff
    finish_reason: str | None = None
    error: str | None = None
    recomputes: int = 0
    failures: int = 0  # workers that failed while computing it (died, hung, or raised on it)
    failed_on: set[str] = field(default_factory=set)  # those workers: a retry prefers others
    suspect: bool = False  # it was on a worker that died, and has not come through a step on another since
    prefill_model_s: float = 0.0  # this request's share of its workers' prefill / decode step time
    decode_model_s: float = 0.0
    prefill_cached_tokens: int = 0  # prompt tokens its prefill steps took from a prefix cache
    prefill_computed_tokens: int = 0  # tokens its prefill steps computed
    tier_cached_tokens: dict[str, int] = field(default_factory=dict)  # of the cached ones, what a KV tier served
    session: str = ""  # the agent session it is a turn of (`user`, X-Session-Id): its KV is retained after it
    local_prefill: bool = False  # its decode worker prefilled it (conditional disaggregation): no handoff
    mask_s: float = 0.0  # its grammar's masks' compute time, summed over its steps (beside the forward passes)
    prefix_chains: dict[tuple[bytes, int], list[bytes]] = field(default_factory=dict)  # (root, block size) -> chain
    times: RequestTimes = field(default_factory=RequestTimes)
    token_buckets: TokenBuckets = field(default_factory=TokenBuckets)  # its tokens after the first, over time
    moves: list[RequestMove] = field(default_factory=list)  # its session's live moves, as its trace shows them
    # the samples of the same prompt (a request with n > 1), itself included: routed together, so that the
    # prompt's KV is computed once and its full blocks shared through the workers' prefix caches
    siblings: list["TrackedRequest"] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.stage is RequestStage.DONE

    def sibling_prefill_workers(self) -> set[str]:
        return {s.prefill_worker for s in self.siblings if s is not self and not s.done and s.prefill_worker}

    def sibling_decode_workers(self) -> set[str]:
        return {s.decode_worker for s in self.siblings if s is not self and not s.done and s.decode_worker}

    def computed_by(self) -> str | None:
        """The worker running its model steps (adopting its KV counts), if one is."""
        if self.decode_worker is not None:
            return self.decode_worker
        return self.prefill_worker if self.stage is RequestStage.PREFILL else None

    def holder(self) -> str | None:
        """The worker whose engine holds the running sequence."""
        if self.stage is RequestStage.DECODE:
            return self.decode_worker
        return self.prefill_worker if self.stage in (RequestStage.PREFILL, RequestStage.HANDOFF) else None

    def record(self) -> dict:
        """The timing breakdown: ttft_s = queue_s (arrival → its prefill step starts) + prefill_s (→ first
        token back in the controller); then handoff_wall_s (KV on its way to a decode worker) and
        first_decode_s (KV landed → first decoded token)."""
        t = self.times
        end = t.finished or time.time()
        first = t.first_token or end
        started = t.prefill_start or first
        return {
            "request_id": self.request_id,
            "arrival": t.arrival,
            "queue_s": started - t.arrival,
            "prefill_s": first - started,
            "ttft_s": first - t.arrival,
            "handoff_s": t.handoff_seconds,
            "handoff_bytes": t.handoff_bytes,
            "handoff_wall_s": (t.handoff_end - t.handoff_start) if t.handoff_end and t.handoff_start else 0.0,
            "first_decode_s": (t.second_token - (t.handoff_end or first)) if t.second_token else 0.0,
            "decode_s": end - first,
            "e2e_s": end - t.arrival,
            "prompt_tokens": len(self.prompt_token_ids),
            "output_tokens": len(self.output_token_ids),
            "prefill_worker": self.prefill_worker,
            "decode_worker": self.decode_worker,
            "outcome": (self.error and "error") or self.finish_reason or "running",
            "recomputes": self.recomputes,
            "prefill_cached_tokens": self.prefill_cached_tokens,
            "prefill_computed_tokens": self.prefill_computed_tokens,
            "tier_cached_tokens": dict(self.tier_cached_tokens),
            "session": self.session,
            "local_prefill": self.local_prefill,
            "constraint": self.params.constraint,
            "mask_s": self.mask_s,
            "token_bucket_s": self.token_buckets.bucket_s,
            "token_counts": list(self.token_buckets.counts),
        }
