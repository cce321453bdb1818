"""The CPU's C kernels over an int8 KV pool (`--kv-dtype int8`, kernels/kv_quant): the KV store quantizes to the
torch reference's very bytes (float32 and bf16 keys, rows of zeros, ties, subnormal scales), decode attention reads
the codes as the reference reads its dequantized blocks (GQA, sequences of several lengths, sliding windows), and
the fused decode step (kernels/cpu_step.c) writes and reads an int8 pool as the per-op path does."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.kernels import cpu_rows, kv_quant, ops
from fleetctl.kernels.paged_attention import paged_decode_attention_ref
from fleetctl.kernels.store_kv import store_kv_ref
from fleetctl.tests.support.family_models import WINDOW

HEAD_DIM = 64
WIDTH = kv_quant.stored_width(HEAD_DIM)
PROMPTS = [[(7 * i + 3 * s) % 300 + 3 for i in range(WINDOW + 5 + 9 * s)] for s in range(3)]  # past the window


def _rows(tokens: int, heads: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """k or v [tokens, heads, 64] in `dtype`: rows from 1e-3 to 1e3 in size, a row of zeros (scale 0), a row whose
    codes all fall on a half (x / scale = j + 1/2 exactly: rounding half to even), a row whose scale is subnormal."""
    magnitudes = torch.logspace(-3, 3, tokens)[:, None, None]
    x = torch.randn(tokens, heads, HEAD_DIM, generator=generator) * magnitudes
    x[1, 0] = 0
    halves = (2 * torch.arange(-32, 31) + 1) / 128  # (j + 1/2) / 64, exact in bf16
    x[2, heads - 1] = torch.cat([halves, torch.tensor([127 / 64])])  # amax 127/64: the scale is 1/64 exactly
    x[3, 0] *= 3e-38 / x[3, 0].abs().max()  # max |x| / 127 is a subnormal: divided by FLT_MIN instead
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_into_an_int8_pool_writes_the_references_bytes(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(11)
    k, v = _rows(48, 3, dtype, generator), _rows(48, 3, dtype, generator).flip(0)
    pool = torch.randint(-128, 128, (2, 8, 16, 3, WIDTH), dtype=torch.int8, generator=generator)
    slots = torch.randperm(128, generator=generator)[:48]
    ours, theirs, routed = pool.clone(), pool.clone(), pool.clone()
    assert cpu_rows.takes_store(k, ours)
    cpu_rows.store_kv(k, v, ours, slots)
    store_kv_ref(k, v, theirs, slots)
    assert torch.equal(ours, theirs) and not torch.equal(ours, pool)  # the slots' rows, and nothing else
    ops.store_kv(k, v, routed, slots)
    assert torch.equal(routed, ours)


def test_a_pool_the_kernels_cannot_read_goes_to_torch() -> None:
    q, k = torch.randn(1, 4, HEAD_DIM), torch.randn(1, 2, HEAD_DIM)
    rows_of_d = torch.zeros(2, 4, 16, 2, HEAD_DIM, dtype=torch.int8)  # int8, but no room for the scales
    assert not cpu_rows.takes_store(k, rows_of_d) and not cpu_rows.takes_attention(q, rows_of_d)
    other_dtype = torch.zeros(2, 4, 16, 2, HEAD_DIM, dtype=torch.bfloat16)  # neither q's dtype nor int8
    assert not cpu_rows.takes_store(k, other_dtype) and not cpu_rows.takes_attention(q, other_dtype)
    rows = torch.zeros(2, 4, 16, 2, WIDTH, dtype=torch.int8)
    assert cpu_rows.takes_store(k, rows) and cpu_rows.takes_attention(q, rows)


def _int8_pool() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A [2, 60, 16, 3, 66] int8 pool of rows of many sizes (so each row's scale counts), four sequences' shuffled
    block tables [4, 13] and their context lengths (up to 13 blocks, the last one partly filled)."""
    generator = torch.Generator().manual_seed(12)
    values = torch.randn(2, 60, 16, 3, HEAD_DIM, generator=generator)
    values *= torch.randn(2, 60, 16, 3, 1, generator=generator).exp()
    tables = torch.randperm(60, generator=generator)[:52].reshape(4, 13).to(torch.int32)
    return kv_quant.quantize_rows(values), tables, torch.tensor([5, 33, 70, 201], dtype=torch.int32)


@pytest.mark.parametrize("window", [None, 7, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [3, 9, 60])  # 1, 3 or 20 query heads on each of 3 KV heads (past 16: two tasks)
def test_decode_attention_over_an_int8_pool_is_the_reference(dtype: torch.dtype, window: int | None,
                                                             heads: int) -> None:
    kv, tables, lens = _int8_pool()
    q = torch.randn(4, heads, HEAD_DIM, generator=torch.Generator().manual_seed(13)).to(dtype)
    assert cpu_rows.takes_attention(q, kv)
    out = cpu_rows.decode_attention(q, kv, tables, lens, 0.125, window)
    # in float32 for bf16 queries too: the reference's bf16 SDPA would round each key, value and weight, where the
    # kernel (in float32 throughout) rounds its output once
    expected = paged_decode_attention_ref(q.float(), kv, tables, lens, 0.125, None, window)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2**-8, atol=1e-5)
    torch.testing.assert_close(out.float(), expected, **tolerance)
    keys = ops.decode_step_keys(tables, lens, kv.shape[2], window)
    assert keys is None  # the C kernel reads the tables itself: nothing gathered for torch's
    assert torch.equal(ops.decode_attention(q, kv, tables, lens, 0.125, keys, window), out)


def _decode_step_pools(engine: LLMEngine) -> tuple[list[torch.Tensor], tuple]:
    """Prefills PROMPTS into the engine's own pool, then: that pool's layers quantized into int8 pools, and the
    first decode step's (input_ids, positions, batch)."""
    for prompt in PROMPTS:
        engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.step()
    return [kv_quant.quantize_rows(layer) for layer in engine.kv_cache.layers], \
        engine.runner._prepare(engine.scheduler.schedule())


def _forward(engine: LLMEngine, step: tuple, pools: list[torch.Tensor], fused: bool) -> torch.Tensor:
    model, plan = engine.model, engine.model.cpu_decode
    assert plan is not None and plan.takes(len(PROMPTS), step[2])
    model.cpu_decode = plan if fused else None
    try:
        with torch.inference_mode():
            return model.forward(*step, pools).clone()
    finally:
        model.cpu_decode = plan


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama3", "qwen3", "gemma3"])  # plain; q/k norms; windows in a pool apart
def test_the_fused_step_over_int8_pools_is_the_per_op_path(family: str, dtype: str,
                                                           family_model_dirs: dict[str, Path]) -> None:
    settings = EngineSettings(dtype=dtype, num_kv_blocks=64, max_num_seqs=4)
    engine = LLMEngine(EngineConfig(model_dir=family_model_dirs[family], settings=settings))
    pools, step = _decode_step_pools(engine)
    fused_pools, per_op_pools = [p.clone() for p in pools], [p.clone() for p in pools]
    fused = _forward(engine, step, fused_pools, fused=True)
    assert torch.equal(fused, _forward(engine, step, per_op_pools, fused=False))
    assert all(torch.equal(a, b) for a, b in zip(fused_pools, per_op_pools, strict=True))  # the same K/V stored
    assert not all(torch.equal(a, b) for a, b in zip(fused_pools, pools, strict=True))
    unquantized = _forward(engine, step, [layer.clone() for layer in engine.kv_cache.layers], fused=True)
    assert torch.nn.functional.cosine_similarity(fused.float(), unquantized.float()).min() > 0.99


def test_the_fused_step_refuses_a_pool_it_cannot_read(family_model_dirs: dict[str, Path]) -> None:
    settings = EngineSettings(dtype="float32", num_kv_blocks=64, max_num_seqs=4)
    engine = LLMEngine(EngineConfig(model_dir=family_model_dirs["llama3"], settings=settings))
    pools, step = _decode_step_pools(engine)
    with pytest.raises(ValueError, match="KV pools"):
        _forward(engine, step, [p[..., :-kv_quant.SCALE_BYTES].contiguous() for p in pools], fused=True)
    with pytest.raises(ValueError, match="KV pools"):
        _forward(engine, step, [p.to(torch.bfloat16) for p in engine.kv_cache.layers], fused=True)
