"""A constrained session's grammar is session state: a JSON-schema stream (greedy, `--deterministic`) is
token-identical to one engine's run of the same request whether its session is moved live, its worker migrated
through a checkpoint, killed (the session recomputed elsewhere) or switched to prefill. Each landing rebuilds the
matcher from the grammar and replays it over the output so far; a wrong replay would change the mask."""

import json
import os
import signal
from pathlib import Path

import pytest
from support.fleet_harness import Stream, cli_json, decoding_on, serve, start_streams, wait_until, worker_pids

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.server.response_format import json_schema_grammar

pytestmark = pytest.mark.fleet

TOKENS = 120
# the note is too long for TOKENS: the grammar never completes, every token of the stream is masked
SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "minLength": 2000}, "n": {"type": "integer"}},
          "required": ["note", "n"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "note", "schema": SCHEMA}}
PROMPTS = [f"Session {i} writes a note about" + " the weather" * (2 * i + 1) for i in range(4)]
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--kv-blocks", "256")
SLOW_STEPS = {"FLEET_FAULTS": "step=stall:0.05"}  # each step slowed: a session is still decoding when it is moved


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path) -> list[str]:
    engine = LLMEngine(EngineConfig(tiny_model_dir, settings=EngineSettings(dtype="float32", deterministic=True)))
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True, grammar=json_schema_grammar(SCHEMA))
    texts = [result.text for result in engine.generate(PROMPTS, params)]
    free = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True))
    assert texts[0].startswith('{"note": "') and free[0].text != texts[0]  # the grammar decides every token
    return texts


def stream(i: int) -> Stream:
    return Stream(PROMPTS[i], request_id=f"c{i}", extra_body={"response_format": FORMAT})


def holder(url: str, i: int) -> str:
    found: list[str] = []
    assert wait_until(lambda: found.append(decoding_on(url, f"c{i}", 8) or "") or found[-1], 60)
    return found[-1]


def other(worker: str) -> str:
    return "decode-1" if worker == "decode-0" else "decode-0"


def test_a_constrained_stream_survives_a_move_a_checkpoint_a_kill_and_a_switch(tiny_model_dir: Path,
                                                                                expected: list[str]) -> None:
    with serve(tiny_model_dir, *FLEET, env=SLOW_STEPS) as url:
        moved = start_streams(url, [stream(0)], TOKENS)
        source = holder(url, 0)
        op = cli_json("move", "c0", "--to", other(source), "--url", url)
        assert op["to"] == other(source), op
        assert moved.result(timeout=300) == [expected[0]]

        migrated = start_streams(url, [stream(1)], TOKENS)
        source = holder(url, 1)
        outcome = cli_json("migrate", source, "--to", "cpu:3", "--via", "checkpoint", "--url", url)
        assert outcome["mode"] == "restored" and outcome["sessions"] >= 1, outcome
        assert migrated.result(timeout=300) == [expected[1]]

        killed = start_streams(url, [stream(2)], TOKENS)
        os.kill(worker_pids(url)[holder(url, 2)], signal.SIGKILL)
        assert killed.result(timeout=300) == [expected[2]]

        switched = start_streams(url, [stream(3)], TOKENS)
        source = holder(url, 3)
        switch = cli_json("switch", source, "--role", "prefill", "--url", url)
        assert switch["sessions_moved"] >= 1, json.dumps(switch)
        assert switched.result(timeout=300) == [expected[3]]
