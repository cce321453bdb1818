"""Traces: the Mooncake format (tests/planner/data/mooncake_small.jsonl, 12 requests of two conversations whose
prompts share 512-token blocks), as the planner and bench read it, and the synthetic `shift` trace."""

import json
from pathlib import Path

import pytest

from fleetctl.console.loadgen.synthetic import LENGTHS, TraceKind, make_trace
from fleetctl.console.loadgen.traces import load_trace, trace_from_file
from fleetctl.engine.api.trace_file import read_mooncake
from fleetctl.errors import UserError

EXAMPLE = Path(__file__).parent / "data" / "mooncake_small.jsonl"


def test_the_example_trace_reads_in_arrival_order() -> None:
    records = read_mooncake(EXAMPLE)
    assert len(records) == 12
    assert records[0].arrival_s == 0.0 and records[-1].arrival_s == pytest.approx(6.158)
    assert [r.arrival_s for r in records] == sorted(r.arrival_s for r in records)
    assert (records[4].input_length, records[4].output_length, records[4].hash_ids) == (661, 10, (0, 1))


def test_bench_prompts_share_the_blocks_their_hash_ids_share() -> None:
    requests = trace_from_file(EXAMPLE)
    words = [r.prompt.split() for r in requests]
    assert [len(w) for w in words] == [r.input_length for r in read_mooncake(EXAMPLE)]
    assert words[0] == words[2][:205]  # both start with block 0
    assert words[4][:512] == words[6][:512] == words[8][:512]  # block 0, then block 1
    assert words[4][512:661] == words[6][512:661]
    assert words[0][:50] != words[1][:50]  # another conversation, other blocks
    assert requests[5].max_tokens == 34 and requests[5].arrival_s == pytest.approx(2.459)


@pytest.mark.parametrize(("line", "message"), [
    ("not json", r":1: not JSON"),
    ('{"timestamp": 0, "output_length": 5}', r":1: 'input_length' must be a number >= 0, got None"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 5}', r"'timestamp' must be a number >= 0"),
    ('{"timestamp": 0, "input_length": true, "output_length": 5}', r"'input_length' must be a number >= 0, got True"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 5}', r"input_length and output_length must be >= 1"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": ["a"]}', r"'hash_ids' must be a list"),
    ("[1, 2]", r"expected a JSON object per line"),
    ("", r"holds no requests"),
])
def test_a_bad_trace_is_one_line_naming_the_place(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(UserError, match=message) as error:
        read_mooncake(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_load_trace_takes_a_kind_or_a_file(tmp_path: Path) -> None:
    name, requests = load_trace("rag", 3, 2.0)
    assert name == "rag" and len(requests) == 3
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(json.dumps({"timestamp": t, "input_length": 3, "output_length": 2}) for t in (0, 500)))
    name, requests = load_trace(str(path), 99, 2.0)  # a file is replayed whole, at its own times
    assert name == "two.jsonl" and [r.arrival_s for r in requests] == [0.0, 0.5]
    with pytest.raises(UserError, match=r"no trace 'rga': use chat, rag, agent, shift, or the path"):
        load_trace("rga", 3, 2.0)


def test_shift_is_rag_then_agent() -> None:
    requests = make_trace(TraceKind.SHIFT, 20, 4.0, seed=3)
    (rag_prompts, _), (agent_prompts, _) = LENGTHS[TraceKind.RAG], LENGTHS[TraceKind.AGENT]
    assert all(rag_prompts[0] <= r.prompt_words <= rag_prompts[1] for r in requests[:10])
    assert all(agent_prompts[0] <= r.prompt_words <= agent_prompts[1] for r in requests[10:])
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
