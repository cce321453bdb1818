"""Engine core on the tiny random Llama: correctness against transformers, KV accounting,
batch invariance under `deterministic`, sampling, stop conditions and errors."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.prompt import PromptError
from fleetctl.engine.core.sequence import SamplingError, SamplingParams
from fleetctl.kernels.packed_linear import PackedWeight, pack

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a small model that served many requests on one node. Numbers 0 1 2",
    "def",
    "Prefill reads the prompt in one pass; decode writes the answer a token at a time. " * 2,
]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def make_engine(model_dir: Path, **overrides: object) -> LLMEngine:
    options: dict = {"dtype": "float32", "num_kv_blocks": 64} | overrides
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=EngineSettings(**options)))


@pytest.mark.slow  # over ~10 s: `make test` runs it, `make test-fast` does not
def test_greedy_matches_transformers(tiny_model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    engine = make_engine(tiny_model_dir)
    for prompt in PROMPTS:
        ids = engine.tokenizer.encode(prompt)
        ours = engine.generate([ids], GREEDY)[0].token_ids
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None)
        assert ours == ref[0, len(ids) :].tolist()


def test_last_step_logits_match_transformers(tiny_model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    engine = make_engine(tiny_model_dir)
    ids = engine.tokenizer.encode(PROMPTS[1])
    seq = engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0))
    step = engine.scheduler.schedule()
    input_ids, positions, batch = engine.runner._prepare(step)
    with torch.inference_mode():
        hidden = engine.model.forward(input_ids, positions, batch, engine.kv_cache.tensor)
        ours = engine.model.logits(hidden)
        ref = hf(torch.tensor([ids])).logits[0]
    engine.release(seq.request_id)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_blocks_are_returned_after_finish_and_preemption(tiny_model_dir: Path) -> None:
    # 10 blocks of 16 slots cannot hold four sequences of ~40-60 tokens at once: forces preemption.
    engine = make_engine(tiny_model_dir, num_kv_blocks=10, deterministic=True)
    roomy = make_engine(tiny_model_dir, deterministic=True)
    tight = engine.generate(PROMPTS, GREEDY)
    assert engine.scheduler.num_preemptions > 0
    assert engine.kv_cache.allocator.num_used == 0
    assert engine.kv_cache.allocator.num_free == 10
    # preempted sequences are recomputed; deterministic numerics give the same tokens
    assert [r.token_ids for r in tight] == [r.token_ids for r in roomy.generate(PROMPTS, GREEDY)]


def test_abort_frees_blocks(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    seq = engine.add_request(PROMPTS[0], GREEDY)
    engine.step()
    assert engine.kv_cache.allocator.num_used > 0
    engine.release(seq.request_id)
    assert engine.kv_cache.allocator.num_used == 0
    assert not engine.has_unfinished()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deterministic_batch_equals_each_alone(tiny_model_dir: Path, dtype: str) -> None:
    """Relies on batch-invariant numerics (deterministic=True), not on equal batch composition."""
    engine = make_engine(tiny_model_dir, deterministic=True, dtype=dtype)
    batched = engine.generate(PROMPTS, GREEDY)
    alone = [engine.generate([p], GREEDY)[0] for p in PROMPTS]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]


def test_deterministic_late_joiner_matches_alone(tiny_model_dir: Path) -> None:
    """A sequence that joins while others decode (continuous batching) gets the tokens it gets alone."""
    engine = make_engine(tiny_model_dir, deterministic=True)
    engine.add_request(PROMPTS[1], GREEDY, request_id="early")
    for _ in range(5):
        engine.step()
    late = engine.add_request(PROMPTS[0], GREEDY, request_id="late")
    while engine.has_unfinished():
        engine.step()
    assert late.output_token_ids == engine.generate([PROMPTS[0]], GREEDY)[0].token_ids


def test_seeded_sampling_is_reproducible(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, deterministic=True)
    seeded = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    first = engine.generate([PROMPTS[0]], seeded)[0].token_ids
    with_others = engine.generate([PROMPTS[0], PROMPTS[2]], seeded)[0].token_ids
    other_seed = engine.generate([PROMPTS[0]], SamplingParams(**{**seeded.__dict__, "seed": 99}))[0].token_ids
    assert first == with_others
    assert first != other_seed


def test_max_tokens_and_stop_strings(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    full = engine.generate([PROMPTS[0]], GREEDY)[0]
    assert len(full.token_ids) == 24 and full.finish_reason == "length"
    stop = full.text[8:11]
    assert len(stop) == 3
    stopped = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=24, temperature=0.0, stop=(stop,)))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.index(stop)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_are_packed_where_bf16_is_native(tiny_model_dir: Path, dtype: str) -> None:
    """float32 matrices stay plain (MKL takes them as they are); bf16 ones get oneDNN's blocked copy beside them
    where the CPU has bf16 instructions."""
    weights = make_engine(tiny_model_dir, dtype=dtype).model.weights
    matrices = [weights.lm_head, *(m for w in weights.layers for m in (w.qkv, w.o_proj, w.gate_up, w.down))]
    packs = dtype == "bfloat16" and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert all(isinstance(m, PackedWeight) is packs for m in matrices)
    assert isinstance(weights.embed, torch.Tensor)  # the embedding stays indexable


def test_eos_stops_generation(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    eos = next(iter(engine.tokenizer.eos_token_ids))
    # make the model always pick EOS by biasing its output row (of a copy of the plain head, then packed again)
    head = engine.model.weights.lm_head
    head = (head.plain if isinstance(head, PackedWeight) else head).clone()
    head[eos] = head.abs().max() * 50
    engine.model.weights.lm_head = pack(head)
    result = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=10, temperature=0.0))[0]
    assert result.finish_reason == "stop" and result.token_ids == [eos] and result.text == ""


def test_chat_template_renders(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert engine.tokenizer.encode(text)[0] == engine.tokenizer.bos_token_id


def test_bad_input_is_rejected(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    with pytest.raises(PromptError, match="context is 512 tokens"):
        engine.add_request(list(range(10)) * 60, GREEDY)
    with pytest.raises(PromptError, match="empty"):
        engine.add_request("", GREEDY)
    with pytest.raises(PromptError, match="token ids"):
        engine.add_request([10**6], GREEDY)
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -2}, {"max_tokens": 0}, {"stop": ("",)}):
        with pytest.raises(SamplingError):
            SamplingParams(**bad)
    assert not engine.has_unfinished()


def test_a_sequence_never_outgrows_the_pool_and_never_blocks_the_queue(tiny_model_dir: Path) -> None:
    """A 2-block pool holds 32 tokens: a request asking for more ends with `length` there (it would
    otherwise be preempted forever, starving the request queued behind it)."""
    engine = make_engine(tiny_model_dir, num_kv_blocks=2)
    long = engine.add_request(list(range(3, 13)), SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
    short = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    for _ in range(200):
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished()
    assert long.finish_reason.value == "length" and long.num_tokens == 32
    assert short.finish_reason.value == "length" and len(short.output_token_ids) == 4
    assert engine.kv_cache.allocator.num_free == 2
