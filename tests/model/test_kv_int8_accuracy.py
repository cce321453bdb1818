"""An int8 KV pool on the real models (smollm2-135m and gemma3-270m, bf16): perplexity over the fixed 2,048-token
text within 0.5 % of the bf16 pool's (one prefill reads every key and value back from the pool), and greedy tokens
equal to the bf16 pool's up to the first near-tie."""

from pathlib import Path

import pytest

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, KVDtype
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.tests.model.test_quantized_smollm2 import (
    CLEAR_MARGIN,
    PROMPTS,
    TEXT_TOKENS,
    fixed_text_ids,
    perplexity,
    sequence_logits,
)

pytestmark = pytest.mark.slow

NEW_TOKENS = 64


def engine(model_dir: Path, kv_dtype: KVDtype) -> LLMEngine:
    settings = EngineSettings(dtype="bfloat16", kv_dtype=kv_dtype, num_kv_blocks=(TEXT_TOKENS + 512) // 16,
                              max_num_batched_tokens=TEXT_TOKENS, prefix_cache=False)
    return LLMEngine(EngineConfig(model_dir, settings=settings))


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_dir")


def test_int8_kv_keeps_perplexity_and_greedy_tokens(model_dir: Path) -> None:
    wide, narrow = engine(model_dir, KVDtype.AUTO), engine(model_dir, KVDtype.INT8)
    ids = fixed_text_ids(wide)
    wide_ppl, narrow_ppl = (perplexity(sequence_logits(llm, ids), ids) for llm in (wide, narrow))
    assert abs(narrow_ppl / wide_ppl - 1) <= 0.005, (narrow_ppl, wide_ppl)

    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for prompt, ours, theirs in zip(PROMPTS, narrow.generate(PROMPTS, params), wide.generate(PROMPTS, params),
                                    strict=True):
        differ = next((i for i, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids, strict=True)) if a != b),
                      None)
        if differ is None:
            continue
        top2 = sequence_logits(wide, wide.encode_prompt(prompt) + theirs.token_ids[:differ])[-1].topk(2).values
        assert (top2[0] - top2[1]).item() < CLEAR_MARGIN, (prompt, differ, top2)  # only a near tie may flip
