"""Synthetic request traces for `fleetctl bench` (and `fleetctl demo`'s traffic): prompt and output
lengths drawn per trace kind, prompt text made of common words (so token counts are close to the
requested lengths)."""

import random
from dataclasses import dataclass
from enum import StrEnum


class TraceKind(StrEnum):
    CHAT = "chat"  # prompts 64-512 tokens, outputs 64-256
    RAG = "rag"  # long prompts, short answers: prefill-heavy
    AGENT = "agent"  # medium prompts, short outputs, many turns


LENGTHS = {
    TraceKind.CHAT: ((64, 512), (64, 256)),
    TraceKind.RAG: ((1024, 3072), (32, 128)),
    TraceKind.AGENT: ((256, 1024), (16, 64)),
}
_WORD_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which but have
an they you were her she there one all we their been has when who will more no if out so said what
up its about into than them can only other new some could time these two may then do first any my
now such like our over man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good very
make world still own see men work long get here between both life being under never day same another
know while last might us great old year off come since against go came right used take three
"""
WORDS = tuple(_WORD_TEXT.split())


def prompt_text(rng: random.Random, words: int) -> str:
    """`words` common words drawn with `rng`: about one token each for a BPE trained on English."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass(frozen=True)
class TraceRequest:
    prompt: str
    prompt_words: int
    max_tokens: int
    arrival_s: float  # offset from the start of the run


def make_trace(kind: TraceKind, count: int, rate: float, seed: int = 0) -> list[TraceRequest]:
    """`count` requests with Poisson arrivals at `rate` per second (rate <= 0: all at once)."""
    rng = random.Random(seed)
    (p_lo, p_hi), (o_lo, o_hi) = LENGTHS[kind]
    clock = 0.0
    requests = []
    for _ in range(count):
        words = rng.randint(p_lo, p_hi)
        requests.append(TraceRequest(prompt_text(rng, words), words, rng.randint(o_lo, o_hi), clock))
        if rate > 0:
            clock += rng.expovariate(rate)
    return requests
