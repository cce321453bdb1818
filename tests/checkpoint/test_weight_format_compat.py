"""Checkpoint compat pins the weight format: a checkpoint taken at int4 restores with its KV on an int4 engine
and cold-starts on an int8 one, the reason naming the field (its KV was computed by other weights)."""

from pathlib import Path

import pytest

from fleetctl.domain import Quantization, WorkerRole
from fleetctl.engine.checkpoint.engine_io import current_compat, restore_engine, write_engine_checkpoint
from fleetctl.engine.checkpoint.format import RestoreMode, read_checkpoint
from fleetctl.engine.core.config import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def engine(model_dir: Path, quantization: Quantization) -> LLMEngine:
    settings = EngineSettings(dtype="bfloat16", quantization=quantization, num_kv_blocks=64)
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=settings))


@pytest.fixture(scope="module")
def int4_checkpoint(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = engine(tiny_model_dir, Quantization.INT4)
    for i, prompt in enumerate(["The quick brown fox", "Once upon a time there was"]):
        source.add_request(prompt, PARAMS, request_id=f"r{i}")
    for _ in range(3):
        source.step()
    root = tmp_path_factory.mktemp("checkpoints")
    path, sessions, _ = write_engine_checkpoint(source, "decode-0", WorkerRole.DECODE, current_compat(source, "cpu"),
                                                root, "decode-0-int4", on_writer=lambda pid: None)
    assert sessions == 2
    return path


@pytest.mark.parametrize(("quantization", "mode"), [(Quantization.INT4, RestoreMode.RESTORED),
                                                    (Quantization.INT8, RestoreMode.COLD_START)])
def test_the_weight_format_decides_restore_or_cold_start(tiny_model_dir: Path, int4_checkpoint: Path,
                                                         quantization: Quantization, mode: RestoreMode) -> None:
    destination = engine(tiny_model_dir, quantization)
    result = restore_engine(destination, read_checkpoint(int4_checkpoint), current_compat(destination, "cpu"))
    assert result.mode is mode and result.sessions == 2
    if mode is RestoreMode.COLD_START:
        assert result.reason == "weights: checkpoint has 'int4-g32', destination has 'int8'"
    continued: set[str] = set()
    while destination.has_unfinished():  # the sessions go on either way, with their KV or recomputed
        continued |= {out.request_id for out in destination.step()}
    assert continued == {"r0", "r1"}
