"""What `fleetctl bench --trace` names: a synthetic kind (synthetic.py), agent sessions (agent_sessions.py), or
a trace file replayed as recorded: a session trace, or a Mooncake trace whose requests sharing hash ids share
their prompts' leading blocks."""

import random
from pathlib import Path

from fleetctl.console.loadgen.agent_sessions import (
    REFERENCE_CONTEXT,
    agent_sessions,
    is_session_trace,
    read_session_trace,
)
from fleetctl.console.loadgen.requests import WORDS, TraceRequest, prompt_text
from fleetctl.console.loadgen.synthetic import TraceKind, make_trace
from fleetctl.engine.api.trace_file import MOONCAKE_BLOCK_TOKENS, TraceRecord, read_mooncake
from fleetctl.errors import UserError


def _prompt_of(record: TraceRecord, line: int) -> str:
    """`input_length` words whose every 512-word block is drawn from its hash id, so that requests sharing
    hash ids share that prefix; words beyond the listed blocks are the request's own."""
    blocks = [prompt_text(random.Random(h), MOONCAKE_BLOCK_TOKENS) for h in record.hash_ids]
    words = " ".join(blocks).split()[: record.input_length]
    own = random.Random(f"line-{line}")
    return " ".join(words + [own.choice(WORDS) for _ in range(record.input_length - len(words))])


def trace_from_file(path: Path | str) -> list[TraceRequest]:
    """A Mooncake trace (`engine/api/trace_file.py`) as bench requests, arrivals as recorded."""
    return [TraceRequest(_prompt_of(r, i), r.input_length, r.output_length, r.arrival_s)
            for i, r in enumerate(read_mooncake(path))]


def load_trace(name: str, count: int, rate: float, seed: int = 0, context: int | None = None,
               tool_s: float = 0.0) -> tuple[str, list[TraceRequest]]:
    """(name, requests) for `--trace`: a synthetic kind (`count` requests at `rate`; agent sessions sized
    for a model of `context` tokens, start at `rate`, their tool calls `tool_s` s on average), or else the path
    of a trace file, replayed whole: a session trace or a Mooncake trace (raises UserError)."""
    if name == TraceKind.AGENT:
        return name, agent_sessions(count, rate, seed, context or REFERENCE_CONTEXT, tool_s)
    if name in TraceKind.__members__.values():
        return name, make_trace(TraceKind(name), count, rate, seed)
    if not Path(name).is_file():
        kinds = ", ".join(TraceKind)
        raise UserError(f"no trace {name!r}: use {kinds}, or the path of a trace file (JSONL: sessions or "
                        f"Mooncake)")
    if is_session_trace(Path(name)):
        return Path(name).name, read_session_trace(name)
    return Path(name).name, trace_from_file(name)
