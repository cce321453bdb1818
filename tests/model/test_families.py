"""Every supported family against transformers, on a tiny random model transformers itself wrote
(support/family_models): float32 logits at every position of a prompt longer than the sliding window, and
greedy tokens over 48 steps, with and without the prefix cache."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.tests.support.family_models import FAMILY_CONFIGS, WINDOW, load_reference, reference_greedy

FAMILIES = list(FAMILY_CONFIGS)
PROMPT = [(7 * i + 3) % 300 + 3 for i in range(2 * WINDOW + 13)]  # past the window: windowed layers drop keys
GREEDY = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)


def engine_for(model_dir: Path, **settings: object) -> LLMEngine:
    options: dict = {"dtype": "float32", "num_kv_blocks": 64} | settings
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=EngineSettings(**options)))


def all_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] float32: the engine's logits at every position of one prefill."""
    seq = engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0))
    input_ids, positions, batch = engine.runner._prepare(engine.scheduler.schedule())
    with torch.inference_mode():
        logits = engine.model.logits(engine.model.forward(input_ids, positions, batch, engine.kv_cache.layers))
    engine.release(seq.request_id)
    return logits


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_at_every_position(family: str, family_model_dirs: dict[str, Path]) -> None:
    model_dir = family_model_dirs[family]
    ours = all_logits(engine_for(model_dir), PROMPT)
    with torch.no_grad():
        ref = load_reference(model_dir)(torch.tensor([PROMPT])).logits[0]
    # float32 both; the engine's CPU kernels (kernels/cpu_rows, cpu_gemv) sum in their own order: a few ulps apart
    torch.testing.assert_close(ours, ref, atol=5e-5, rtol=1e-5)


@pytest.mark.slow  # six families x 48 tokens through transformers' generate
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers_with_and_without_the_prefix_cache(
        family: str, family_model_dirs: dict[str, Path]) -> None:
    model_dir = family_model_dirs[family]
    expected = reference_greedy(model_dir, PROMPT, GREEDY.max_tokens)
    assert engine_for(model_dir).generate([PROMPT], GREEDY)[0].token_ids == expected
    cached = engine_for(model_dir, prefix_cache=True)
    cached.generate([PROMPT], GREEDY)
    again = cached.add_request(PROMPT, GREEDY)
    cached.step()
    assert cached.last_step.cached_tokens[0] >= 3 * cached.kv_cache.spec.block_size  # its full blocks, cached
    while cached.has_unfinished():
        cached.step()
    assert again.output_token_ids == expected


def test_longrope_rotates_with_its_short_factors_when_served_within_the_original_length(
        family_model_dirs: dict[str, Path]) -> None:
    """The other tests run Phi-3 past its original 16 positions (long factors, as transformers does for a
    sequence that long); an engine asked for no more than 16 rotates with the short ones, as transformers does
    for a shorter sequence."""
    model_dir = family_model_dirs["phi3"]
    assert engine_for(model_dir).model.long_rope
    engine = engine_for(model_dir, max_model_len=16)
    assert not engine.model.long_rope and engine.max_model_len == 16
    ids = PROMPT[:14]
    with torch.no_grad():
        ref = load_reference(model_dir)(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(all_logits(engine, ids), ref, atol=1e-5, rtol=1e-5)
    long_table = all_logits(engine_for(model_dir), ids)
    assert not torch.allclose(long_table, ref, atol=1e-3)  # the long factors rotate otherwise
