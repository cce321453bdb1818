"""Chunked prefill in a running engine: a prompt computed a chunk per step (the token budget smaller
than the prompt, chunk edges on and off block boundaries, several prompts sharing a step's budget)
gives every logits bit of the unchunked run in deterministic mode, fp32 and bf16, and the same greedy
tokens in the default (fast) mode."""

from pathlib import Path

import pytest
import torch
from test_batch_invariance import recorded_logits

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

PROMPTS = [[(7 * i + 13 * salt) % 300 + 3 for i in range(n)] for salt, n in enumerate((90, 37, 3, 40))]
GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=5, temperature=0.9, top_p=0.95, seed=5, ignore_eos=True)


def run(model_dir: Path, budget: int, dtype: str, deterministic: bool, params: SamplingParams,
        ) -> tuple[list[list[int]], dict[tuple[str, int], torch.Tensor]]:
    settings = EngineSettings(dtype=dtype, deterministic=deterministic, num_kv_blocks=128,
                              max_num_batched_tokens=budget, prefix_cache=False)
    engine = LLMEngine(EngineConfig(model_dir, settings=settings))
    with recorded_logits() as rows:
        results = engine.generate(PROMPTS, params)
    by_prompt = {r.request_id: i for i, r in enumerate(results)}
    return [r.token_ids for r in results], {(by_prompt[rid], pos): row for (rid, pos), row in rows.items()}


@pytest.mark.parametrize(("dtype", "budget"), [("float32", 13), ("bfloat16", 16)])
def test_chunked_prefill_keeps_every_logits_bit_in_deterministic_mode(small_model_dir: Path, dtype: str,
                                                                      budget: int) -> None:
    for params in (GREEDY, SEEDED):
        tokens, logits = run(small_model_dir, 4096, dtype, True, params)
        chunked_tokens, chunked_logits = run(small_model_dir, budget, dtype, True, params)
        assert chunked_tokens == tokens
        assert logits.keys() == chunked_logits.keys()
        for key, row in logits.items():
            assert torch.equal(row, chunked_logits[key]), key


def test_chunked_prefill_gives_the_same_greedy_tokens_in_the_default_mode(small_model_dir: Path) -> None:
    tokens, logits = run(small_model_dir, 4096, "float32", False, GREEDY)
    chunked_tokens, chunked_logits = run(small_model_dir, 16, "float32", False, GREEDY)
    assert chunked_tokens == tokens
    for key, row in logits.items():
        torch.testing.assert_close(chunked_logits[key], row, atol=1e-4, rtol=1e-4)
