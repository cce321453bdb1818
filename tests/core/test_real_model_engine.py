"""Real weights: smollm2-135m through the engine vs Hugging Face transformers on the same directory."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Explain in one sentence why the sky is blue.",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def transformers_model(smollm2_dir: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def test_greedy_tokens_and_logits_match_transformers(smollm2_dir: Path, transformers_model) -> None:
    """fp32, greedy, each prompt alone: token ids identical; logits of the last decode step within 2e-3
    (same weights, different summation order in matmuls/attention)."""
    engine = LLMEngine(EngineConfig(smollm2_dir, settings=EngineSettings(dtype="float32", num_kv_blocks=256)))
    last_logits: list[torch.Tensor] = []
    model_logits = engine.model.logits

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        out = model_logits(hidden)
        last_logits.append(out)
        return out

    engine.model.logits = recording
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for prompt in PROMPTS:
        ids = engine.tokenizer.encode(prompt)
        ours = engine.generate([ids], params)[0].token_ids
        with torch.inference_mode():
            ref = transformers_model.generate(
                torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None
            )[0, len(ids) :].tolist()  # eos_token_id=None: like ignore_eos, run past EOS (no EOS suppression)
            full = torch.tensor([ids + ours[:-1]])
            ref_logits = transformers_model(full).logits[0, -1]
        assert ours == ref, prompt
        torch.testing.assert_close(last_logits[-1][0], ref_logits, atol=2e-3, rtol=0)


def test_chat_generation_answers(smollm2_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(smollm2_dir, settings=EngineSettings(dtype="float32", num_kv_blocks=128)))
    chat = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    result = engine.generate([chat], SamplingParams(max_tokens=24, temperature=0.0))[0]
    assert "Paris" in result.text
    assert result.finish_reason == "stop"


def test_tokenizer_matches_transformers(smollm2_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ours = LLMEngine(EngineConfig(smollm2_dir, settings=EngineSettings(dtype="float32", num_kv_blocks=8))).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    for text in [*PROMPTS, "12345 + 678 = 7023", "naïve café — 東京 🚀", "<|im_start|>user\nhi<|im_end|>\n"]:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def test_logprobs_match_transformers_log_softmax(smollm2_dir: Path, transformers_model) -> None:
    """fp32, sampled at temperature 0.8 with top-p: each token's reported logprob and its top 5 are the
    raw model's (log-softmax of transformers' logits at that position), within 5e-3."""
    engine = LLMEngine(EngineConfig(smollm2_dir, settings=EngineSettings(dtype="float32", num_kv_blocks=256)))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True, logprobs=5)
    worst = 0.0
    for prompt in PROMPTS[:3]:
        ids = engine.tokenizer.encode(prompt)
        seq = engine.add_request(ids, params)
        outputs = []
        while engine.has_unfinished():
            outputs += engine.step()
        with torch.inference_mode():
            logits = transformers_model(torch.tensor([ids + seq.output_token_ids[:-1]])).logits[0, len(ids) - 1 :]
        reference = torch.log_softmax(logits.float(), dim=-1)  # [NEW_TOKENS, V]
        for position, out in enumerate(outputs):
            assert out.logprobs is not None
            worst = max(worst, abs(out.logprobs.logprob - float(reference[position, out.token_id])))
            ref_values, ref_ids = reference[position].topk(5)
            ours = torch.tensor([v for _, v in out.logprobs.top])
            worst = max(worst, float((ours - ref_values).abs().max()))
            assert {t for t, _ in out.logprobs.top[:3]} <= set(ref_ids.tolist())
    print(f"logprobs max abs diff vs transformers: {worst:.2e}")
    assert worst < 5e-3
