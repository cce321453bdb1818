"""gemma3-270m, the real weights: fleetctl's greedy tokens are transformers' (float32, the pulled directory), and
the auto weight format serves the model's own dtype (its GGUF ships too few layer weights in 4-bit blocks)."""

from pathlib import Path

import pytest
import torch

from fleetctl.domain import Quantization
from fleetctl.engine.core.config import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.quantize import resolve_quantization

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "Water boils at"]
TOKENS = 32


@pytest.fixture(scope="module")
def fp32(gemma3_dir: Path) -> LLMEngine:
    settings = EngineSettings(dtype="float32", quantization=Quantization.AUTO, num_kv_blocks=64,
                              max_num_batched_tokens=512, prefix_cache=False)
    return LLMEngine(EngineConfig(gemma3_dir, settings=settings))


def test_auto_serves_the_dense_weights(gemma3_dir: Path) -> None:
    assert resolve_quantization(Quantization.AUTO, gemma3_dir) is Quantization.NONE


def test_greedy_tokens_are_transformers(gemma3_dir: Path, fp32: LLMEngine) -> None:
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(gemma3_dir, dtype=torch.float32).eval()
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    for prompt, ours in zip(PROMPTS, fp32.generate(PROMPTS, params), strict=True):
        ids = fp32.encode_prompt(prompt)
        with torch.no_grad():
            theirs = reference.generate(torch.tensor([ids]), max_new_tokens=TOKENS, min_new_tokens=TOKENS,
                                        do_sample=False)[0, len(ids):].tolist()
        assert ours.token_ids == theirs, prompt


def test_it_knows_the_capital_of_france(fp32: LLMEngine) -> None:
    # the pretrained model (not instruction-tuned: its GGUF has no chat template), so a question in a pattern
    prompt = "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of France?\nA:"
    [out] = fp32.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0))
    assert "Paris" in out.text
