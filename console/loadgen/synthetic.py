"""Synthetic traces for `fleetctl bench --trace chat|rag|shift`: Poisson arrivals, prompt and output lengths drawn
per trace kind (`agent`, multi-turn sessions, is agent_sessions.py's)."""

import random
from enum import StrEnum

from fleetctl.console.loadgen.requests import TraceRequest, prompt_text


class TraceKind(StrEnum):
    CHAT = "chat"  # prompts 64-512 tokens, outputs 64-256
    RAG = "rag"  # long prompts, short answers: prefill-heavy
    AGENT = "agent"  # multi-turn sessions sharing a long system prompt: short tool results and answers
    SHIFT = "shift"  # rag-like first half, agent-like second half: the right split moves mid-run


LENGTHS = {
    TraceKind.CHAT: ((64, 512), (64, 256)),
    TraceKind.RAG: ((1024, 3072), (32, 128)),
    TraceKind.AGENT: ((256, 1024), (16, 64)),
}  # SHIFT draws its first half as RAG, its second as AGENT (single requests of an agent's turn sizes)


def make_trace(kind: TraceKind, count: int, rate: float, seed: int = 0) -> list[TraceRequest]:
    """`count` requests with Poisson arrivals at `rate` per second (rate <= 0: all at once)."""
    rng = random.Random(seed)
    clock = 0.0
    requests = []
    for i in range(count):
        shape = kind if kind is not TraceKind.SHIFT else (TraceKind.RAG if i < count // 2 else TraceKind.AGENT)
        (p_lo, p_hi), (o_lo, o_hi) = LENGTHS[shape]
        words = rng.randint(p_lo, p_hi)
        requests.append(TraceRequest(prompt_text(rng, words), words, rng.randint(o_lo, o_hi), clock))
        if rate > 0:
            clock += rng.expovariate(rate)
    return requests
