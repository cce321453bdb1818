"""Multi-turn traffic for `fleetctl bench`: synthetic agent sessions (`--trace agent`) and session trace
files (JSONL). A session's turns are sent in order, each once the previous one has ended, its prompt
appended to the previous turn's prompt and answer (runner.py) — so every turn re-sends the
whole conversation, which a prefix cache serves.

Synthetic agent sessions (ReAct-style): one system prompt with tool descriptions shared by every
session (~1.5k tokens on an 8k-context model), a task, then per turn a tool result of 50-300 tokens
and an answer (reasoning + action) of 30-150 tokens, 4-12 turns; sizes scale with the model's context
so that a whole session fits it. Sessions start with Poisson arrivals at the given rate. With a tool time,
each later turn waits for its tool call after the previous one ended: exponential, of that mean (drawn apart
from the sessions' sizes, so the same seed gives the same conversations with or without it).

Session trace files: one JSON object per line, `{"session_id": str | int, "turn": int, "prompt": str}`
or `"prompt_tokens": int` instead of `prompt` (that many words, drawn from the session and turn),
`"output_tokens": int`, `"arrival_s": float` (seconds from the start; a turn is sent at that time or
when its previous turn ended, whichever is later), `"pause_s": float` (seconds a turn waits after its
previous turn ended: a tool call; 0 by default). `prompt` is what the turn appends to the
conversation. A line with `session_id` marks the file as a session trace (Mooncake lines have none)."""

import json
import random
from pathlib import Path

from fleetctl.console.loadgen.requests import TraceRequest, prompt_text
from fleetctl.engine.api.trace_file import json_lines
from fleetctl.errors import UserError

REFERENCE_CONTEXT = 8192  # the context the sizes below are for (smollm2-135m's); others scale them
SYSTEM_WORDS = 1536
TASK_WORDS = (40, 120)
TOOL_RESULT_WORDS = (50, 300)
ANSWER_TOKENS = (30, 150)
TURNS = (4, 12)
FILL = 0.8  # of the context a session may use: words are about one token each, not exactly one


TOOL_NAMES = ("search", "read", "run", "write")
TASK = "Task: "
OBSERVATION = "\nObservation: "
THOUGHT = "\nThought:"


def system_parts(words: int) -> tuple[str, dict[str, str]]:
    """The shared system prompt's prose and each tool's description (the same text for every run)."""
    rng = random.Random("agent-system")
    descriptions = {name: prompt_text(rng, words // 8) for name in TOOL_NAMES}
    return prompt_text(rng, words // 2), descriptions


def system_prompt(words: int) -> str:
    """The system prompt and tool descriptions every session shares."""
    prose, descriptions = system_parts(words)
    tools = "\n".join(f"Tool {name}: {text}" for name, text in descriptions.items())
    return f"System: {prose}\n{tools}\n"


def first_turn_parts(prompt: str) -> tuple[str, dict[str, str], str]:
    """A synthetic session's first prompt read back as (the system prompt's prose, the tools' descriptions, the
    task): what `bench --tools` sends as chat messages and function tools."""
    system, _, task = prompt.partition(TASK)
    prose, *tools = system.strip().split("\n")
    descriptions = dict(line.removeprefix("Tool ").split(": ", 1) for line in tools)
    return prose.removeprefix("System: "), descriptions, task.strip()


def observation_of(prompt: str) -> str:
    """A synthetic session's later turn read back as the tool result it holds."""
    return prompt.removeprefix(OBSERVATION).removesuffix(THOUGHT)


def agent_sessions(count: int, rate: float, seed: int = 0, context: int = REFERENCE_CONTEXT,
                   tool_s: float = 0.0) -> list[TraceRequest]:
    """Sessions until `count` turns in all (the last one cut short if needed), starting at `rate` per second
    (rate <= 0: all at once), each later turn after a tool call of `tool_s` seconds on average (0: none)."""
    rng = random.Random(seed)
    tools = random.Random(f"tools-{seed}")
    scale = min(1.0, context / REFERENCE_CONTEXT)

    def draw(bounds: tuple[int, int]) -> int:
        return max(1, round(rng.randint(*bounds) * scale))

    system_words = max(8, round(SYSTEM_WORDS * scale))
    system = system_prompt(system_words)
    turns: list[TraceRequest] = []
    clock = 0.0
    session = 0
    while len(turns) < count:
        used = system_words + draw(TASK_WORDS)
        first = f"{system}{TASK}{prompt_text(rng, used - system_words)}\n"
        for turn in range(min(rng.randint(*TURNS), count - len(turns))):
            answer = draw(ANSWER_TOKENS)
            words = used - system_words if turn == 0 else draw(TOOL_RESULT_WORDS)
            if turn and used + words + answer > context * FILL:
                break
            text = first if turn == 0 else f"{OBSERVATION}{prompt_text(rng, words)}{THOUGHT}"
            pause = tools.expovariate(1 / tool_s) if turn and tool_s > 0 else 0.0
            turns.append(TraceRequest(text, words, answer, clock, session_id=f"s{session}", turn=turn,
                                      pause_s=pause))
            used += (words if turn else 0) + answer
        session += 1
        if rate > 0:
            clock += rng.expovariate(rate)
    return turns


def is_session_trace(path: Path) -> bool:
    """Whether the file's first JSON line names a session (else it is read as a Mooncake trace)."""
    try:
        with path.open() as lines:
            first = next((line for line in lines if line.strip()), "")
        obj = json.loads(first)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(obj, dict) and "session_id" in obj


def _count(obj: dict, name: str, where: str, minimum: int) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{where}: {name!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _turn(obj: dict, where: str) -> TraceRequest:
    session = obj.get("session_id")
    if isinstance(session, bool) or not isinstance(session, str | int):
        raise UserError(f"{where}: 'session_id' must be a string or an integer, got {session!r}")
    turn = _count(obj, "turn", where, 0)
    output = _count(obj, "output_tokens", where, 1)
    arrival = obj.get("arrival_s", 0.0)
    if isinstance(arrival, bool) or not isinstance(arrival, int | float) or arrival < 0:
        raise UserError(f"{where}: 'arrival_s' must be a number >= 0, got {arrival!r}")
    pause = obj.get("pause_s", 0.0)
    if isinstance(pause, bool) or not isinstance(pause, int | float) or pause < 0:
        raise UserError(f"{where}: 'pause_s' must be a number >= 0, got {pause!r}")
    if ("prompt" in obj) == ("prompt_tokens" in obj):
        raise UserError(f"{where}: give exactly one of 'prompt' and 'prompt_tokens'")
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise UserError(f"{where}: 'prompt' must be a non-empty string")
        words = len(prompt.split())
    else:
        words = _count(obj, "prompt_tokens", where, 1)
        prompt = ("\n" if turn else "") + prompt_text(random.Random(f"{session}-{turn}"), words)
    return TraceRequest(prompt, words, output, float(arrival), session_id=str(session), turn=turn,
                        pause_s=float(pause))


def read_session_trace(path: Path | str) -> list[TraceRequest]:
    """A session trace's turns, by arrival; each session's turns numbered 0, 1, … without a gap."""
    path = Path(path)
    turns = [_turn(obj, where) for where, obj in json_lines(path)]
    if not turns:
        raise UserError(f"trace {path} holds no requests")
    sessions: dict[str, list[int]] = {}
    for t in turns:
        sessions.setdefault(t.session_id or "", []).append(t.turn)
    for session, numbers in sessions.items():
        if sorted(numbers) != list(range(len(numbers))):
            raise UserError(f"{path}: session {session!r} has turns {sorted(numbers)}: number them 0, 1, … "
                            f"once each")
    return sorted(turns, key=lambda t: (t.arrival_s, t.session_id or "", t.turn))
