"""Multi-turn traffic for bench: synthetic agent sessions, session trace files (told apart from Mooncake
ones), and bench sending a session's turns in order with the conversation so far."""

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from fleetctl.console.loadgen.agent_sessions import (
    ANSWER_TOKENS,
    FILL,
    TOOL_RESULT_WORDS,
    TURNS,
    agent_sessions,
    read_session_trace,
    system_prompt,
)
from fleetctl.console.loadgen.requests import TraceRequest
from fleetctl.console.loadgen.runner import send_trace, turn_latencies
from fleetctl.console.loadgen.traces import load_trace
from fleetctl.errors import UserError


def by_session(turns: list[TraceRequest]) -> dict[str, list[TraceRequest]]:
    sessions: dict[str, list[TraceRequest]] = {}
    for t in turns:
        sessions.setdefault(t.session_id, []).append(t)
    return sessions


def test_agent_sessions_share_a_system_prompt_and_have_the_issue_shapes() -> None:
    turns = agent_sessions(100, rate=2.0, seed=4)
    assert len(turns) == 100
    sessions = by_session(turns)
    system = system_prompt(1536)
    assert 1536 * 0.9 < len(system.split()) < 1536 * 1.1
    for number, (_, session) in enumerate(sessions.items()):
        assert [t.turn for t in session] == list(range(len(session)))
        if number < len(sessions) - 1:  # the last one may be cut short by the request count
            assert TURNS[0] <= len(session) <= TURNS[1]
        assert session[0].prompt.startswith(system) and len({t.arrival_s for t in session}) == 1
        assert all(TOOL_RESULT_WORDS[0] <= t.prompt_words <= TOOL_RESULT_WORDS[1] for t in session[1:])
        assert all(ANSWER_TOKENS[0] <= t.max_tokens <= ANSWER_TOKENS[1] for t in session)
        words = sum(len(t.prompt.split()) + t.max_tokens for t in session)
        assert words <= 8192 * FILL * 1.02  # "Observation:"/"Thought:" labels are a few words more per turn
    starts = [s[0].arrival_s for s in sessions.values()]
    assert starts == sorted(starts) and starts[-1] > 0


def test_agent_sessions_scale_to_a_small_context() -> None:
    turns = agent_sessions(30, rate=0.0, context=512)
    for session in by_session(turns).values():
        assert sum(len(t.prompt.split()) + t.max_tokens for t in session) <= 512 * FILL * 1.2
    assert all(t.arrival_s == 0.0 for t in turns)


def test_tool_time_pauses_later_turns_and_keeps_the_conversations() -> None:
    plain = agent_sessions(200, rate=2.0, seed=3)
    paused = agent_sessions(200, rate=2.0, seed=3, tool_s=4.0)
    assert [(t.prompt, t.max_tokens, t.arrival_s) for t in paused] == [(t.prompt, t.max_tokens, t.arrival_s)
                                                                      for t in plain]
    assert all(t.pause_s == 0.0 for t in plain) and all(t.pause_s == 0.0 for t in paused if t.turn == 0)
    pauses = [t.pause_s for t in paused if t.turn > 0]
    assert all(p > 0 for p in pauses) and 3.0 < sum(pauses) / len(pauses) < 5.0


def test_session_trace_files_are_read_and_told_from_mooncake(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    lines = [{"session_id": "a", "turn": 0, "prompt": "hello there", "output_tokens": 5, "arrival_s": 0},
             {"session_id": 7, "turn": 0, "prompt_tokens": 12, "output_tokens": 3, "arrival_s": 0.5},
             {"session_id": "a", "turn": 1, "prompt_tokens": 4, "output_tokens": 2, "arrival_s": 0.1, "pause_s": 2}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    name, turns = load_trace(str(path), 99, 1.0)
    assert name == "sessions.jsonl"
    assert [(t.session_id, t.turn, t.prompt_words, t.max_tokens, t.arrival_s) for t in turns] == [
        ("a", 0, 2, 5, 0.0), ("a", 1, 4, 2, 0.1), ("7", 0, 12, 3, 0.5)]
    assert [t.pause_s for t in turns] == [0.0, 2.0, 0.0]
    assert turns[0].prompt == "hello there" and len(turns[2].prompt.split()) == 12
    assert turns[1].prompt.startswith("\n")  # a drawn continuation starts on its own line
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text(json.dumps({"timestamp": 0, "input_length": 3, "output_length": 2}) + "\n")
    assert load_trace(str(mooncake), 9, 1.0)[1][0].session_id is None


@pytest.mark.parametrize(("line", "message"), [
    ({"session_id": "a", "turn": 0, "output_tokens": 2}, "exactly one of 'prompt' and 'prompt_tokens'"),
    ({"session_id": "a", "turn": -1, "prompt": "x", "output_tokens": 2}, "'turn' must be an integer >= 0"),
    ({"session_id": None, "turn": 0, "prompt": "x", "output_tokens": 2}, "'session_id' must be"),
    ({"session_id": "a", "turn": 0, "prompt": "x", "output_tokens": 0}, "'output_tokens' must be an integer >= 1"),
    ({"session_id": "a", "turn": 1, "prompt": "x", "output_tokens": 2}, r"session 'a' has turns \[1\]"),
    ({"session_id": "a", "turn": 0, "prompt": "x", "output_tokens": 2, "arrival_s": "soon"}, "'arrival_s' must be"),
    ({"session_id": "a", "turn": 0, "prompt": "x", "output_tokens": 2, "pause_s": -1}, "'pause_s' must be"),
])
def test_a_bad_session_line_is_one_error_naming_the_place(tmp_path: Path, line: dict, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(UserError, match=message) as error:
        read_session_trace(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_bench_sends_a_sessions_turns_in_order_with_the_conversation_so_far() -> None:
    prompts: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["prompt"]
        prompts.append(prompt)
        if prompt.endswith("boom"):
            return httpx.Response(500, text="no")
        text = f" <answer {len(prompts)}>"
        chunks = [{"choices": [{"text": text}]}, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    trace = [TraceRequest("S.", 1, 2, 0.0, "s", 0), TraceRequest(" tool one.", 2, 2, 0.0, "s", 1),
             TraceRequest(" tool two.", 2, 2, 0.0, "s", 2), TraceRequest("single", 1, 2, 0.0),
             TraceRequest("T boom", 2, 2, 0.0, "t", 0), TraceRequest(" never", 1, 2, 0.0, "t", 1)]

    async def run() -> list:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://fleet") as http:
            return await send_trace(http, "m", trace)

    outcomes = asyncio.run(run())
    session = [p for p in prompts if p.startswith("S.")]
    assert len(session) == 3 and session[0] == "S."
    first_answer = session[1].removeprefix("S.").removesuffix(" tool one.")
    assert first_answer.startswith(" <answer ") and session[2].startswith(session[1])
    assert session[2].endswith(" tool two.") and "single" in prompts and " never" not in "".join(prompts)
    assert len(outcomes) == 6 and sum(1 for o in outcomes if o.error) == 2
    latencies = turn_latencies(outcomes)
    assert set(latencies) == {"ttft_first_turn_s", "ttft_later_turns_s"}


def test_a_turn_waits_for_its_tool_call_after_the_previous_turn_ended() -> None:
    sent: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(time.perf_counter())
        body = f"data: {json.dumps({'choices': [{'text': ' ok'}]})}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    trace = [TraceRequest("S.", 1, 2, 0.0, "s", 0), TraceRequest(" tool.", 1, 2, 0.0, "s", 1, pause_s=0.3)]

    async def run() -> list:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://fleet") as http:
            return await send_trace(http, "m", trace)

    outcomes = asyncio.run(run())
    assert not any(o.error for o in outcomes) and sent[1] - sent[0] >= 0.3
