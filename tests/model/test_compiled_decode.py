"""The compiled decode step (`--compile`) against eager decoding: the same greedy tokens on the tiny model and on
smollm2 in fp32; in bf16 (eager in the CPU's C kernels, the graph in torch's ops) parting only at a near tie on the
tiny model, a known difference on smollm2 (below); with batches padded up to their bucket and
sequences joining and leaving mid-run; the padding rows write only the pool's scratch block; and when an engine
stays eager, why."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.decode_compile import compile_refusal
from fleetctl.engine.core.engine_settings import CompileMode, EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.compiled_decode import bucket_for, buckets_up_to

NEAR_TIE = 0.05  # logprob gap between the two likeliest tokens that a bf16 rounding may flip
# (step at which it joins, prompt, new tokens): batches of 1, 3 (bucket 4), 5 (bucket 8) and back down
SCHEDULE = [(0, "The quick brown fox", 24), (0, "Once upon a time", 9), (0, "def add(a, b):", 17),
            (5, "In the beginning", 20), (5, "The capital of France is", 6), (12, "Roses are red", 14)]


def decode_run(model_dir: Path, dtype: str, mode: CompileMode) -> tuple[list[list[int]], LLMEngine]:
    tokens, _, engine = decode_margins(model_dir, dtype, mode)
    return tokens, engine


def decode_margins(model_dir: Path, dtype: str,
                   mode: CompileMode) -> tuple[list[list[int]], list[list[float]], LLMEngine]:
    """SCHEDULE's greedy tokens per sequence, and at each the gap between the two likeliest tokens' logprobs."""
    settings = EngineSettings(dtype=dtype, compile=mode, max_num_seqs=8, num_kv_blocks=96, prefix_cache=False)
    engine = LLMEngine(EngineConfig(model_dir, settings=settings))
    seqs, step = [], 0
    margins: dict[str, list[float]] = {}
    while step == 0 or engine.has_unfinished():
        for at, prompt, tokens in SCHEDULE:
            if at == step:
                seqs.append(engine.add_request(prompt, SamplingParams(max_tokens=tokens, temperature=0.0,
                                                                      ignore_eos=True, logprobs=2)))
        for out in engine.step():
            assert out.logprobs is not None
            (_, best), (_, second) = out.logprobs.top
            margins.setdefault(out.request_id, []).append(best - second)
        step += 1
    return [list(s.output_token_ids) for s in seqs], [margins[s.request_id] for s in seqs], engine


@pytest.mark.slow  # over ~10 s: `make test` runs it, `make test-fast` does not
def test_compiled_decode_gives_the_eager_greedy_tokens_in_float32(tiny_model_dir: Path) -> None:
    eager, _ = decode_run(tiny_model_dir, "float32", CompileMode.OFF)
    compiled, engine = decode_run(tiny_model_dir, "float32", CompileMode.ON)
    assert engine.decoder is not None and engine.eager_reason is None
    assert not engine.model.weights.layers[0].qkv.is_mkldnn  # a graph takes plain weights, not packed ones
    assert compiled == eager
    assert [len(t) for t in compiled] == [n for _, _, n in SCHEDULE]


@pytest.mark.slow
def test_compiled_decode_in_bf16_parts_from_eager_only_at_a_near_tie(tiny_model_dir: Path) -> None:
    """In bf16 eager decodes in the CPU's C kernels (kernels/cpu_gemv, cpu_rows: float32 sums, one rounding) and the
    graph in torch's ops: the same greedy tokens until, if ever, eager's two likeliest tokens are within bf16's
    rounding of each other (the tiny model's random weights make such ties common)."""
    eager, margins, _ = decode_margins(tiny_model_dir, "bfloat16", CompileMode.OFF)
    compiled, _, engine = decode_margins(tiny_model_dir, "bfloat16", CompileMode.ON)
    assert engine.decoder is not None and [len(t) for t in compiled] == [n for _, _, n in SCHEDULE]
    for ours, theirs, gaps in zip(compiled, eager, margins, strict=True):
        parted = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
        if parted is not None:
            assert gaps[parted] < NEAR_TIE, (parted, gaps[parted])


def test_padding_rows_write_only_the_scratch_block(tiny_model_dir: Path) -> None:
    settings = EngineSettings(dtype="float32", compile=CompileMode.ON, max_num_seqs=4, num_kv_blocks=16)
    engine = LLMEngine(EngineConfig(tiny_model_dir, settings=settings))
    pool = engine.kv_cache
    assert pool.scratch_block == pool.allocator.num_blocks == 16 and pool.tensor.shape[2] == 17
    engine.warm_up()
    assert not pool.tensor[:, :, :16].any()  # the warm-up decodes padding rows only
    assert pool.tensor[:, :, 16].any()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.xfail(
    strict=True,
    reason="known: in bf16 a compiled step differs from eager by an ulp, where eager's decode products run in the CPU "
           "kernel (kernels/cpu_gemv: float32 sums in its own order, one bf16 rounding) and the graph's in F.linear; "
           "a near-tie on smollm2 then flips a greedy token (float32 agrees)"))])
def test_compiled_decode_gives_the_eager_greedy_tokens_on_smollm2(smollm2_dir: Path, dtype: str) -> None:
    eager, _ = decode_run(smollm2_dir, dtype, CompileMode.OFF)
    compiled, _ = decode_run(smollm2_dir, dtype, CompileMode.ON)
    assert compiled == eager


def test_buckets() -> None:
    assert [bucket_for(n, 64) for n in (1, 2, 3, 5, 16, 17, 64)] == [1, 2, 4, 8, 16, 32, 64]
    assert buckets_up_to(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets_up_to(6) == [1, 2, 4, 8]
    assert buckets_up_to(1) == [1]


@pytest.mark.parametrize(("settings", "prefill_only", "reason"), [
    (EngineSettings(compile=CompileMode.ON), False, None),
    (EngineSettings(compile=CompileMode.OFF), False, "--compile off"),
    (EngineSettings(compile=CompileMode.ON, deterministic=True), False, "deterministic mode runs eagerly"),
    (EngineSettings(compile=CompileMode.ON), True, "a prefill worker does not decode"),
])
def test_when_an_engine_stays_eager(tiny_model_dir: Path, settings: EngineSettings, prefill_only: bool,
                                    reason: str | None) -> None:
    config = EngineConfig(tiny_model_dir, settings=settings, prefill_only=prefill_only)
    refusal = compile_refusal(config, torch.device("cpu"))
    assert refusal == reason if reason is None else reason in (refusal or "")
