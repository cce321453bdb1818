"""Request traces for `fleetctl bench` (and `fleetctl demo`'s traffic): synthetic ones, with prompt and
output lengths drawn per trace kind, multi-turn agent sessions (console/agent_sessions.py), or a trace
file replayed as recorded (Mooncake, or sessions). Prompt text is made of common words (so token counts
are close to the requested lengths)."""

import random
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from fleetctl.engine.planner.trace_file import MOONCAKE_BLOCK_TOKENS, TraceFileError, TraceRecord, read_mooncake


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
    # a turn of a session: sent once the session's previous turn ended, `prompt` appended to its prompt and answer
    session_id: str | None = None
    turn: int = 0
    prompt_token_ids: tuple[int, ...] = ()  # sent instead of `prompt` when given (bench --input-len: exact length)


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


def _prompt_of(record: TraceRecord, line: int) -> str:
    """`input_length` words whose every 512-word block is drawn from its hash id, so that requests sharing
    hash ids share that prefix; words beyond the listed blocks are the request's own."""
    blocks = [prompt_text(random.Random(h), MOONCAKE_BLOCK_TOKENS) for h in record.hash_ids]
    words = " ".join(blocks).split()[: record.input_length]
    own = random.Random(f"line-{line}")
    return " ".join(words + [own.choice(WORDS) for _ in range(record.input_length - len(words))])


def trace_from_file(path: Path | str) -> list[TraceRequest]:
    """A Mooncake trace (`engine.planner.trace_file`) as bench requests, arrivals as recorded."""
    return [TraceRequest(_prompt_of(r, i), r.input_length, r.output_length, r.arrival_s)
            for i, r in enumerate(read_mooncake(path))]


def load_trace(name: str, count: int, rate: float, seed: int = 0,
               context: int | None = None) -> tuple[str, list[TraceRequest]]:
    """(name, requests) for `--trace`: a synthetic kind (`count` requests at `rate`; agent sessions sized
    for a model of `context` tokens, start at `rate`), or else the path of a trace file, replayed whole: a
    session trace or a Mooncake trace (raises TraceFileError)."""
    from fleetctl.console.agent_sessions import REFERENCE_CONTEXT, agent_sessions, is_session_trace, read_session_trace

    if name == TraceKind.AGENT:
        return name, agent_sessions(count, rate, seed, context or REFERENCE_CONTEXT)
    if name in TraceKind.__members__.values():
        return name, make_trace(TraceKind(name), count, rate, seed)
    if not Path(name).is_file():
        kinds = ", ".join(TraceKind)
        raise TraceFileError(f"no trace {name!r}: use {kinds}, or the path of a trace file (JSONL: sessions or "
                             f"Mooncake)")
    if is_session_trace(Path(name)):
        return Path(name).name, read_session_trace(name)
    return Path(name).name, trace_from_file(name)
