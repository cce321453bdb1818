"""The decode step as one C call (engine/model/cpu_decode, kernels/cpu_step.c) against the decoder's per-op path
over the same kernels: the same hidden states to the bit, for every family (biases, q/k norms, sandwich norms, GeGLU,
sliding windows in their own pool, local rope, partial rotary), in float32 and bfloat16, dense and quantized, at one
sequence and at several; and where it steps aside (prefill, the deterministic mode, more rows than it takes)."""

from pathlib import Path

import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.kernels import cpu_gemv, packed_linear
from fleetctl.tests.support.family_models import FAMILY_CONFIGS, WINDOW

PROMPTS = [[(7 * i + 3 * s) % 300 + 3 for i in range(WINDOW + 5 + 9 * s)] for s in range(3)]  # past the window


def _engine(model_dir: Path, **settings: object) -> LLMEngine:
    options: dict = {"dtype": "float32", "num_kv_blocks": 64, "max_num_seqs": 4} | settings
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=EngineSettings(**options)))


def _decode_both_ways(engine: LLMEngine, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefills the prompts, then runs their first decode step through the C step and through the per-op path
    (each writes the same K/V): the final hidden states of each, [B, D]."""
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.step()
    model = engine.model
    input_ids, positions, batch = engine.runner._prepare(engine.scheduler.schedule())
    assert not batch.is_prefill and model.cpu_decode is not None and model.cpu_decode.takes(len(prompts), batch)
    with torch.inference_mode():
        fused = model.forward(input_ids, positions, batch, engine.kv_cache.layers).clone()
        plan, model.cpu_decode = model.cpu_decode, None
        try:
            per_op = model.forward(input_ids, positions, batch, engine.kv_cache.layers)
        finally:
            model.cpu_decode = plan
    return fused, per_op


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_every_family_decodes_as_the_per_op_path_does(family: str, dtype: str,
                                                     family_model_dirs: dict[str, Path]) -> None:
    fused, per_op = _decode_both_ways(_engine(family_model_dirs[family], dtype=dtype), PROMPTS)
    assert torch.equal(fused, per_op)
    assert fused.abs().sum() > 0


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_weights_decode_as_the_per_op_path_does(quantization: str,
                                                          family_model_dirs: dict[str, Path]) -> None:
    engine = _engine(family_model_dirs["qwen2"], dtype="bfloat16", quantization=quantization, quant_group_size=32)
    assert engine.model.cpu_decode.max_rows == cpu_gemv.max_rows()
    fused, per_op = _decode_both_ways(engine, PROMPTS)
    assert torch.equal(fused, per_op)


def test_greedy_tokens_are_the_per_op_paths(family_model_dirs: dict[str, Path]) -> None:
    engine = _engine(family_model_dirs["gemma3"], dtype="bfloat16")
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    fused = [out.token_ids for out in engine.generate(PROMPTS, greedy)]
    engine.model.cpu_decode = None
    assert [out.token_ids for out in engine.generate(PROMPTS, greedy)] == fused


def test_it_steps_aside_where_it_does_not_take_the_step(family_model_dirs: dict[str, Path]) -> None:
    engine = _engine(family_model_dirs["llama3"], max_num_seqs=16)
    plan = engine.model.cpu_decode
    for prompt in PROMPTS:
        engine.add_request(prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    _, _, prefill = engine.runner._prepare(engine.scheduler.schedule())
    assert not plan.takes(len(PROMPTS), prefill)  # prefill: op by op
    assert _engine(family_model_dirs["llama3"], deterministic=True).model.cpu_decode is None  # fixed tiles
    engine.step()
    _, _, decode = engine.runner._prepare(engine.scheduler.schedule())
    assert plan.takes(len(PROMPTS), decode)
    assert plan.max_rows == packed_linear.FLOAT32_ROW_LIMIT  # float32 weights: MKL's GEMM past their limit
    from torch.utils.flop_counter import FlopCounterMode  # imports triton: not before tests/kernels' interpreter

    with FlopCounterMode(display=False):  # a dispatch mode sees the per-op path's ops
        assert not plan.takes(len(PROMPTS), decode)
