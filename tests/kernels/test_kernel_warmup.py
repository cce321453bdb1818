"""The kernels' warm-up (engine/core/kernel_warmup.py) through Triton's interpreter on CPU: it launches every
kernel variant that the first prefill and decode steps then use, and writes only the pool's scratch block.
Launches are recorded by specialisation (triton_support.recording_launches); the interpreter compiles
nothing, but a launch outside the warm-up's set is one a GPU worker would stall on."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import CompileMode, EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.kernels import ops, triton_support
from fleetctl.kernels.attention_launch import decode_representatives, prefill_representatives
from fleetctl.kernels.triton_support import int_class, recording_launches

if not triton_support.triton_available():
    pytest.skip("triton is not installed", allow_module_level=True)
if not torch.cuda.is_available():
    triton_support.use_interpreter()  # before anything imports triton

BLOCKS = 16
GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton kernels for CPU tensors too, as FLEET_KERNELS=interpret selects at import."""
    monkeypatch.setattr(ops, "_TRITON_EVERYWHERE", True)


def eager_engine(model_dir: Path, prefill_only: bool = False) -> LLMEngine:
    settings = EngineSettings(dtype="float32", compile=CompileMode.OFF, max_num_seqs=4, num_kv_blocks=BLOCKS,
                              prefix_cache=False)
    return LLMEngine(EngineConfig(model_dir, settings=settings, prefill_only=prefill_only))


def test_warm_up_covers_the_first_steps_and_keeps_real_blocks(tiny_model_dir: Path, interpreted: None) -> None:
    engine = eager_engine(tiny_model_dir)
    pool = engine.kv_cache
    assert pool.scratch_block == BLOCKS == pool.allocator.num_blocks
    pool.tensor.normal_(generator=torch.Generator().manual_seed(0))
    real = pool.tensor[:, :, :BLOCKS].clone()
    engine.warm_up()
    assert torch.equal(pool.tensor[:, :, :BLOCKS], real)  # only the scratch block was written
    warmed = engine.warmed_launches
    assert {launch.kernel for launch in warmed} >= {
        "_prefill_kernel", "_decode_kernel", "_store_kv_kernel", "_rms_norm_kernel", "_rotary_kernel",
        "_glu_kernel"}
    # a batch of one, then of three (a longer prompt: tables two blocks wide), prefilled and decoded
    with recording_launches() as launched:
        engine.add_request(list(range(1, 6)), GREEDY)
        engine.step()
        for length in (7, 20, 3):
            engine.add_request(list(range(1, length + 1)), GREEDY)
        while engine.has_unfinished():
            engine.step()
    assert {launch.kernel for launch in launched} >= {"_prefill_kernel", "_decode_kernel"}
    assert launched <= warmed, f"not warmed up: {sorted(launched - warmed)}"


def test_a_prefill_worker_warms_up_no_decode_kernel(tiny_model_dir: Path, interpreted: None) -> None:
    engine = eager_engine(tiny_model_dir, prefill_only=True)
    engine.warm_up()
    kernels = {launch.kernel for launch in engine.warmed_launches}
    assert "_prefill_kernel" in kernels and "_decode_kernel" not in kernels


def test_the_torch_references_need_no_warm_up(tiny_model_dir: Path) -> None:
    engine = eager_engine(tiny_model_dir)  # CPU, FLEET_KERNELS unset: the torch references
    assert engine.kv_cache.scratch_block is None
    engine.warm_up()
    assert engine.warmed_launches == set()


def test_representatives_cover_each_int_class() -> None:
    cpu = torch.device("cpu")
    assert prefill_representatives(4, 40) == [(s, w) for s in (1, 2) for w in (1, 2, 16)]
    assert prefill_representatives(1, 1) == [(1, 1)]
    decode = decode_representatives(64, 40, 16, 2, 32, torch.float32, cpu)
    assert {int_class(width) for _, width in decode} == {"1", "i32", "x16"}  # off CUDA: no split-K
    assert len(decode) == 3


@pytest.mark.slow  # ~10 s or more through the interpreter: `make test` runs it, `make test-fast` does not
def test_a_hybrid_pool_warms_up_in_its_scratch_block_and_slot_and_decodes_through_triton(
        family_model_dirs: dict[str, Path], interpreted: None) -> None:
    from fleetctl.engine.core.window_slots import NO_SLOT
    from fleetctl.tests.support.family_models import WINDOW, reference_greedy

    model_dir = family_model_dirs["gemma3"]  # windowed layers beside a global one: their K/V lives apart
    engine = eager_engine(model_dir)
    pool = engine.kv_cache
    assert pool.scratch_slot is not None and pool.scratch_slot == pool.allocator.window.num_slots
    for tensor in (pool.tensor, pool.window_tensor):
        tensor.normal_(generator=torch.Generator().manual_seed(0))
    real, real_window = pool.tensor[:, :, :BLOCKS].clone(), pool.window_tensor[:, :, : pool.scratch_slot].clone()
    engine.warm_up()
    assert torch.equal(pool.tensor[:, :, :BLOCKS], real) and torch.equal(
        pool.window_tensor[:, :, : pool.scratch_slot], real_window)  # only the scratch block and slot written
    prompt = [(5 * i + 7) % 300 + 3 for i in range(WINDOW + 9)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)  # its window passes the first block
    with recording_launches() as launched:
        seq = engine.add_request(prompt, params)
        while len(seq.output_token_ids) < params.max_tokens - 1:
            engine.step()
        assert seq.window_table[0] == NO_SLOT  # its first block's windowed K/V given back: tables with a gap
        while engine.has_unfinished():
            engine.step()
    assert launched <= engine.warmed_launches, f"not warmed up: {sorted(launched - engine.warmed_launches)}"
    assert seq.output_token_ids == reference_greedy(model_dir, prompt, params.max_tokens)
