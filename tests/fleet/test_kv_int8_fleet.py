"""A fleet whose pools hold int8 KV (`--kv-dtype int8`, tiny model, `--deterministic`): prompts prefilled on one
worker and handed to a decode worker, then moved live between decode workers mid-stream, stream exactly the tokens
`fleetctl generate` makes with an int8 pool (the 8-bit rows cross every wire as they are); /fleet/status and
/fleet/devices name each worker's KV format and its capacity in tokens."""

from pathlib import Path

import httpx
import pytest
from support.fleet_harness import Stream, generate_json, move_each_live, serve, start_streams

pytestmark = pytest.mark.fleet

PROMPTS = ["The quick brown fox", "Once upon a time there was", "def main():\n    return"]
FLAGS = ("--dtype", "float32", "--deterministic", "--kv-blocks", "256", "--kv-dtype", "int8")
TOKENS = 120


def test_int8_kv_streams_generates_tokens_through_handoffs_and_live_moves(tiny_model_dir: Path) -> None:
    reference = [r["text"] for r in generate_json(tiny_model_dir, PROMPTS, *FLAGS, "--max-tokens", str(TOKENS),
                                                  "--ignore-eos")]
    streams = [Stream(p, request_id=f"s{i}") for i, p in enumerate(PROMPTS)]
    # each step slowed (a fault point's stall), so the sessions are still decoding when they move
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2",
               "--served-model-name", "m", *FLAGS, env={"FLEET_FAULTS": "step=stall:0.05"}) as url:
        done = start_streams(url, streams, TOKENS, "m")
        move_each_live(url, [s.request_id for s in streams])
        assert done.result(timeout=300) == reference
        workers = httpx.get(f"{url}/fleet/status", timeout=10).json()["workers"]
        devices = httpx.get(f"{url}/fleet/devices", timeout=10).json()["workers"]
    assert {(w["kv_dtype"], w["kv_tokens"]) for w in workers} == {("int8", 256 * 16)}
    assert {(w["kv_dtype"], w["kv_tokens"]) for w in devices} == {("int8", 256 * 16)}

