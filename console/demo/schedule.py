"""`fleetctl demo`'s traffic plan: which phase runs when, the request shapes of each phase (scaled to
the model's context), and the arrival rate that keeps the fleet busy without drowning it.

The rate follows Little's law: a phase aims at `in_flight` requests on the fleet at once, so it sends
`in_flight / mean latency` requests per second, the latency measured on its own finished requests.
A slower machine or a bigger model therefore gets fewer arrivals, never a growing queue; a cap on the
requests in flight bounds the burst before the first measurement and any overshoot after it."""

import random
from dataclasses import dataclass
from enum import StrEnum

from fleetctl.console.loadgen.requests import TraceRequest, prompt_text
from fleetctl.errors import UserError

MIN_CONTEXT = 128  # below this the phases' shapes no longer differ enough to show anything
MAX_RATE = 20.0  # arrivals per second, whatever the latency (a tiny model answers in milliseconds)
LATENCY_WEIGHT = 0.3  # of each new latency in the running mean (EWMA)


class DemoPhase(StrEnum):
    RAG = "rag"  # prompt-heavy: long prompts, short answers
    AGENT = "agent"  # decode-heavy: short prompts, long answers


PHASE_ORDER = (DemoPhase.RAG, DemoPhase.AGENT)  # repeated for as long as the demo runs


@dataclass(frozen=True)
class PhaseShape:
    prompt_tokens: tuple[int, int]  # inclusive range, drawn uniformly
    output_tokens: tuple[int, int]
    in_flight: int  # requests the phase keeps on the fleet on average

    def __post_init__(self) -> None:
        for lo, hi in (self.prompt_tokens, self.output_tokens):
            if not 1 <= lo <= hi:
                raise ValueError(f"bad token range {lo}..{hi}")
        if self.in_flight < 1:
            raise ValueError("in_flight must be >= 1")


@dataclass(frozen=True)
class TrafficConfig:
    context_len: int  # the served model's context (GET /v1/models max_model_len)
    prompt_workers: int  # workers that take new prompts: prefill, or mixed in a colocated fleet
    decode_workers: int  # workers that decode: decode, or mixed
    phase_seconds: float = 30.0
    tokens_per_word: float = 1.0  # measured on the served tokenizer: prompts are drawn in tokens
    seed: int = 0

    def __post_init__(self) -> None:
        if self.context_len < MIN_CONTEXT:
            raise UserError(f"the model's context ({self.context_len} tokens) is below the demo's {MIN_CONTEXT}")
        if self.prompt_workers < 1 or self.decode_workers < 1:
            raise UserError("the fleet needs a worker that takes prompts and one that decodes")
        if self.phase_seconds <= 0 or self.tokens_per_word <= 0:
            raise UserError("phase_seconds and tokens_per_word must be positive")


def _scaled(context_len: int, fraction: float, cap: int) -> int:
    return max(1, min(cap, int(context_len * fraction)))


def phase_shapes(config: TrafficConfig) -> dict[DemoPhase, PhaseShape]:
    """Lengths are fractions of the context, capped so that on smollm2-135m a CPU slot prefills a long
    prompt in one to three seconds and an agent answer ends within about half a phase (measured on
    shared cores: ~130 ms per token at batch 8, more under load); prompt + answer stays well inside
    the context (the word-to-token ratio is only a mean). RAG keeps two requests per prompt worker in
    flight (one prefilling, the other queued or decoding its short answer: the pool seldom idles and a
    prompt waits for about one other); agent keeps eight per decode worker (decode batches of eight)."""
    c = config.context_len
    return {
        DemoPhase.RAG: PhaseShape(prompt_tokens=(_scaled(c, 1 / 4, 384), _scaled(c, 1 / 2, 768)),
                                  output_tokens=(_scaled(c, 1 / 128, 4), _scaled(c, 1 / 32, 16)),
                                  in_flight=2 * config.prompt_workers),
        DemoPhase.AGENT: PhaseShape(prompt_tokens=(_scaled(c, 1 / 32, 16), _scaled(c, 1 / 16, 32)),
                                    output_tokens=(_scaled(c, 1 / 8, 64), _scaled(c, 1 / 4, 128)),
                                    in_flight=8 * config.decode_workers),
    }


class TrafficSchedule:
    """Phases alternate RAG, agent, RAG, … every `phase_seconds`; requests are drawn per phase."""

    def __init__(self, config: TrafficConfig) -> None:
        self.config = config
        self.shapes = phase_shapes(config)
        self._rng = random.Random(config.seed)

    def phase_at(self, elapsed_s: float) -> tuple[int, DemoPhase]:
        """(phase index, phase kind) at `elapsed_s` seconds since the traffic started."""
        index = int(max(0.0, elapsed_s) // self.config.phase_seconds)
        return index, self.phase_kind(index)

    @staticmethod
    def phase_kind(index: int) -> DemoPhase:
        return PHASE_ORDER[index % len(PHASE_ORDER)]

    def phase_end(self, index: int) -> float:
        return (index + 1) * self.config.phase_seconds

    def draw(self, phase: DemoPhase) -> TraceRequest:
        """A request of `phase`'s shape, to be sent now (arrival 0)."""
        shape = self.shapes[phase]
        words = max(1, round(self._rng.randint(*shape.prompt_tokens) / self.config.tokens_per_word))
        return TraceRequest(prompt_text(self._rng, words), words, self._rng.randint(*shape.output_tokens), 0.0)

    def next_gap(self, rate: float) -> float:
        """Seconds to the next Poisson arrival at `rate` per second."""
        return self._rng.expovariate(rate)


class ArrivalRate:
    """Per phase: arrivals per second from Little's law, and the cap on requests in flight."""

    def __init__(self, shapes: dict[DemoPhase, PhaseShape]) -> None:
        self._shapes = shapes
        self._latency: dict[DemoPhase, float] = {}  # EWMA of end-to-end seconds

    def observe(self, phase: DemoPhase, e2e_s: float) -> None:
        last = self._latency.get(phase)
        self._latency[phase] = e2e_s if last is None else last + LATENCY_WEIGHT * (e2e_s - last)

    def rate(self, phase: DemoPhase) -> float:
        latency = self._latency.get(phase)
        if not latency:  # nothing measured yet: the cap alone paces the first requests
            return MAX_RATE
        return min(MAX_RATE, self._shapes[phase].in_flight / latency)

    def cap(self, phase: DemoPhase) -> int:
        """`in_flight` until a latency is known (no burst beyond the target), then twice that, so that
        Poisson arrivals can swing around the mean without piling up."""
        target = self._shapes[phase].in_flight
        return 2 * target if phase in self._latency else target
