"""An engine's int8 KV pool (`--kv-dtype int8`): rows of codes and a scale (kernels/kv_quant.py), so a block costs
about half the bytes and a pool of the same memory holds about twice the tokens; its K/V is salted apart from a
16-bit pool's (a prefix cached at one format is never read at the other). Its accuracy on the real models:
tests/model/test_kv_int8_accuracy.py."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, KVDtype
from fleetctl.engine.core.kv_cache import KVCacheSpec
from fleetctl.engine.core.llm_engine import LLMEngine


def engine(model_dir: Path, kv_dtype: KVDtype, **settings: object) -> LLMEngine:
    options: dict = {"dtype": "bfloat16", "kv_dtype": kv_dtype, "num_kv_blocks": 64} | settings
    return LLMEngine(EngineConfig(model_dir, settings=EngineSettings(**options)))


@pytest.mark.parametrize(("head_dim", "dtype", "at_least"), [(64, torch.bfloat16, 1.9), (256, torch.bfloat16, 1.98),
                                                             (64, torch.float32, 3.8)])
def test_a_block_costs_its_codes_and_scales(head_dim: int, dtype: torch.dtype, at_least: float) -> None:
    wide, narrow = (KVCacheSpec(30, 3, head_dim, dtype, kv_dtype=kv) for kv in (KVDtype.AUTO, KVDtype.INT8))
    assert narrow.storage_dtype == torch.int8 and narrow.row_width == head_dim + 2 and narrow.label == "int8"
    assert wide.row_width == head_dim and wide.label == str(dtype).removeprefix("torch.")
    assert narrow.bytes_per_block == 30 * 2 * 16 * 3 * (head_dim + 2)
    assert wide.bytes_per_block / narrow.bytes_per_block >= at_least
    assert narrow.bytes_per_value == (head_dim + 2) / head_dim


def test_a_pool_of_the_same_memory_holds_the_tokens_its_bytes_allow(small_model_dir: Path) -> None:
    budget = {"num_kv_blocks": None, "kv_memory_bytes": 8 << 20}
    wide, narrow = engine(small_model_dir, KVDtype.AUTO, **budget), engine(small_model_dir, KVDtype.INT8, **budget)
    assert narrow.kv_cache.tensor.dtype == torch.int8 and narrow.kv_cache.tensor.shape[-1] == 32 + 2
    ratio = narrow.kv_cache.allocator.num_blocks / wide.kv_cache.allocator.num_blocks
    assert ratio == pytest.approx(64 / 34, rel=0.01)  # bf16 rows of 32 values against 32 codes and a 2-byte scale
    assert narrow.kv_cache.nbytes <= 8 << 20


def test_int8_k_v_is_salted_apart(tiny_model_dir: Path) -> None:
    engines = {kv: engine(tiny_model_dir, kv) for kv in KVDtype}
    roots = {kv: llm._salt(llm.kv_cache.spec) for kv, llm in engines.items()}
    assert roots[KVDtype.AUTO].dtype == "bfloat16" and roots[KVDtype.INT8].dtype == "bfloat16/kv-int8"
    assert roots[KVDtype.AUTO].root() != roots[KVDtype.INT8].root()

