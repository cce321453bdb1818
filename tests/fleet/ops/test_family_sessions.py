"""Families beyond Llama on a real fleet (1 prefill + 2 decode workers on CPU slots, `--deterministic`): a
prompt longer than the sliding window is prefilled on one worker, its KV handed off, and the session moved
live mid-stream to the other decode worker — and it streams the tokens transformers' greedy decode makes."""

from pathlib import Path

import httpx
import pytest
import torch
from support.fleet_harness import Stream, decoding_on, fleetctl, serve, start_streams, wait_until

from fleetctl.engine.model.tokenizer import Tokenizer
from fleetctl.tests.support.family_models import WINDOW, load_reference

pytestmark = pytest.mark.fleet  # real worker processes and a real server

TOKENS = 64
PROMPT = "Prefill reads the prompt in one pass; decode writes the answer a token at a time. " * 2
FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--dtype", "float32",
         "--deterministic", "--kv-blocks", "64")


@pytest.mark.parametrize("family", ["gemma3", "mistral", "qwen2", "qwen3", "phi3"])
def test_a_handed_off_and_moved_session_decodes_what_transformers_does(
        family: str, family_model_dirs: dict[str, Path]) -> None:
    model_dir = family_model_dirs[family]
    tokenizer = Tokenizer(model_dir)
    ids = tokenizer.encode(PROMPT)
    assert len(ids) > 2 * WINDOW
    with torch.no_grad():
        out = load_reference(model_dir).generate(torch.tensor([ids]), max_new_tokens=TOKENS, min_new_tokens=TOKENS,
                                                 do_sample=False, eos_token_id=None)
    expected = tokenizer.decode(out[0, len(ids):].tolist())
    with serve(model_dir, *FLEET, env={"FLEET_FAULTS": "step=stall:0.05"}) as url:  # slowed: s0 is moved mid-stream
        stream = start_streams(url, [Stream(PROMPT, request_id="s0")], TOKENS, model_dir.name)
        assert wait_until(lambda: decoding_on(url, "s0", 8) is not None, 120)
        source = decoding_on(url, "s0", 8)
        target = "decode-1" if source == "decode-0" else "decode-0"
        moved = fleetctl("move", "s0", "--to", target, "--url", url)
        assert moved.returncode == 0, moved.stderr
        assert stream.result(timeout=300) == [expected]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert "fleet_kv_handoff_seconds_count 1.0" in metrics  # prefilled on prefill-0, its KV handed off
        assert "fleet_migration_downtime_seconds_count 1.0" in metrics  # and moved once
