"""Per-step FLOPs and bytes from the model's shape, checked by hand on smollm2-135m's shape and
against an independent count on a real (tiny) model."""

from pathlib import Path

import pytest

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.metrics.cost_model import CostModel
from fleetctl.engine.model.model_config import ModelConfig

SMOLLM2 = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
    num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
    max_position_embeddings=8192, tie_word_embeddings=True,
)
BF16 = CostModel(SMOLLM2, weight_bytes=2, kv_bytes=2)

LAYERS = 30 * (576 * 64 * (2 * 9 + 2 * 3) + 3 * 576 * 1536)  # 106,168,320
LM_HEAD = 49152 * 576  # 28,311,552
KV_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # 23,040 bytes in bf16
ATTN_PER_KEY = 4 * 30 * 9 * 64  # QKᵀ + PV, all layers: 69,120 FLOPs per key attended


def test_shape_constants():
    assert (BF16.layer_params, BF16.lm_head_params) == (LAYERS, LM_HEAD) == (106_168_320, 28_311_552)
    assert BF16.layer_params + BF16.lm_head_params == SMOLLM2.num_params == 134_479_872
    assert BF16.kv_bytes_per_token == KV_PER_TOKEN == 23_040


def test_one_decode_token_at_context_100():
    cost = BF16.decode_step([100])
    assert cost.flops == 2 * LAYERS + 2 * LM_HEAD + ATTN_PER_KEY * 100 == 275_871_744
    assert cost.bytes == 2 * (LAYERS + LM_HEAD) + KV_PER_TOKEN * (100 + 1) == 271_286_784


def test_decode_batch_reads_the_weights_once():
    one, batch = BF16.decode_step([100]), BF16.decode_step([100] * 16)
    assert batch.flops == 16 * one.flops
    assert batch.bytes == one.bytes + 15 * KV_PER_TOKEN * 101
    assert batch.bytes < 1.3 * one.bytes  # why decode batching pays: same weights, 16x the work


def test_prefill_charges_logits_once_per_sequence_and_causal_keys():
    cost = BF16.prefill_step([128])
    keys = 128 * 129 // 2  # token i attends i + 1 keys
    assert cost.flops == 2 * LAYERS * 128 + 2 * LM_HEAD + ATTN_PER_KEY * keys
    assert cost.bytes == 2 * (LAYERS + LM_HEAD) + KV_PER_TOKEN * (128 + 128)
    # arithmetic intensity: prefill does far more work per byte than decode
    decode = BF16.decode_step([128])
    assert cost.flops / cost.bytes > 50 * decode.flops / decode.bytes


def test_a_partly_cached_prompt_attends_its_prefix():
    cost = BF16.step([4], [10])  # 6 tokens cached, 4 new
    keys = sum(p + 1 for p in range(6, 10))  # 7 + 8 + 9 + 10
    assert keys == 4 * 6 + 4 * 5 // 2 == 34
    assert cost.flops == 2 * LAYERS * 4 + 2 * LM_HEAD + ATTN_PER_KEY * keys


def test_quantized_layers_and_head_are_charged_their_bytes_as_stored():
    """int4 layers and a GGUF's Q8_0 head: the step reads their codes and scales, not their bf16 size."""
    q4_layers, q8_head = LAYERS * 9 // 16, LM_HEAD * 34 // 32
    cost = CostModel(SMOLLM2, weight_bytes=2, kv_bytes=2, layer_bytes=q4_layers, head_bytes=q8_head)
    assert cost.weight_bytes_per_step == q4_layers + q8_head
    assert cost.decode_step([100]).bytes == q4_layers + q8_head + KV_PER_TOKEN * 101
    assert cost.decode_step([100]).flops == BF16.decode_step([100]).flops


def test_fp32_doubles_the_bytes_not_the_flops():
    fp32 = CostModel(SMOLLM2, weight_bytes=4, kv_bytes=4)
    assert fp32.decode_step([50]).flops == BF16.decode_step([50]).flops
    assert fp32.decode_step([50]).bytes == 2 * BF16.decode_step([50]).bytes


def test_bad_inputs():
    with pytest.raises(ValueError):
        BF16.step([1, 1], [5])
    with pytest.raises(ValueError):
        BF16.step([6], [5])
    with pytest.raises(ValueError):
        BF16.step([0], [5])
    with pytest.raises(ValueError):
        CostModel(SMOLLM2, weight_bytes=0, kv_bytes=2)


def test_counts_agree_with_an_independent_count_on_a_real_model(tiny_model_dir: Path) -> None:
    """The numerators checked against what actually runs: torch's FLOP counter over a prefill step's
    matmuls, and the bytes of the weight tensors and KV pool the engine really holds. The FLOP counter is
    imported here, not at the top: it imports triton, which tests/kernels switch to its interpreter first
    (collected before them, this module failed their collection)."""
    from support.linear_flops import linear_flops
    from torch.utils.flop_counter import FlopCounterMode

    engine = LLMEngine(EngineConfig(tiny_model_dir, settings=EngineSettings(dtype="bfloat16", num_kv_blocks=16)))
    cost = CostModel(engine.model_config, weight_bytes=2, kv_bytes=2)
    for i, prompt in enumerate(([5, 6, 7, 8, 9], list(range(3, 12)))):
        engine.add_request(prompt, SamplingParams(max_tokens=2, temperature=0.0), request_id=str(i))
    with FlopCounterMode(display=False) as counter:
        engine.step()  # one prefill step over both prompts: 14 tokens, 2 logits rows
    assert linear_flops(counter) == 2 * cost.layer_params * 14 + 2 * cost.lm_head_params * 2
    weights = engine.model.weights
    matrices = [m for layer in weights.layers for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
    assert sum(m.numel() * m.element_size() for m in [*matrices, weights.lm_head]) == cost.weight_bytes_per_step
    pool = engine.kv_cache.tensor  # [layers, 2, blocks, block_size, Hkv, d]
    per_token = pool[:, :, 0, 0].numel() * pool.element_size()
    assert per_token == cost.kv_bytes_per_token


def test_a_windowed_layer_is_charged_the_keys_its_window_spans() -> None:
    from dataclasses import replace

    from fleetctl.engine.model.families.base import Traits

    windows = (512, None) * 15  # half the layers windowed
    windowed = CostModel(replace(SMOLLM2, traits=Traits(layer_windows=windows)), weight_bytes=2, kv_bytes=2)
    per_layer_key, per_layer_token = ATTN_PER_KEY // 30, KV_PER_TOKEN // 30
    decode = windowed.decode_step([10_000])
    assert decode.flops == 2 * LAYERS + 2 * LM_HEAD + per_layer_key * 15 * (512 + 10_000)
    assert decode.bytes == 2 * (LAYERS + LM_HEAD) + per_layer_token * 15 * (512 + 10_000) + KV_PER_TOKEN
    # a prefill of 600 tokens: positions below the window attend p + 1 keys, the rest 512
    prefill = windowed.prefill_step([600])
    below, beyond = 512 * 513 // 2, 512 * (600 - 512)
    assert prefill.flops == 2 * LAYERS * 600 + 2 * LM_HEAD + per_layer_key * 15 * (below + beyond + 600 * 601 // 2)
    assert windowed.decode_step([100]) == BF16.decode_step([100])  # within the window: as if global
