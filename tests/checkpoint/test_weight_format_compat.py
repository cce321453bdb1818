"""Checkpoint compat pins what the KV was computed with: a checkpoint taken at int4 restores with its KV on an int4
engine and cold-starts on an int8 one, the reason naming the field (its KV was computed by other weights); one
whose keys longrope's long factors rotated cold-starts on an engine that rotates with the short ones; one of an int8
KV pool restores onto an int8 pool and cold-starts onto a 16-bit one."""

from pathlib import Path

import pytest

from fleetctl.domain import Quantization, WorkerRole
from fleetctl.engine.checkpoint.engine_io import current_compat, restore_engine, write_engine_checkpoint
from fleetctl.engine.checkpoint.format import RestoreMode, read_checkpoint
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, KVDtype
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def engine(model_dir: Path, quantization: Quantization, kv_dtype: KVDtype = KVDtype.AUTO) -> LLMEngine:
    settings = EngineSettings(dtype="bfloat16", quantization=quantization, num_kv_blocks=64, kv_dtype=kv_dtype)
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=settings))


def checkpoint_of_two_sessions(source: LLMEngine, root: Path) -> Path:
    for i, prompt in enumerate(["The quick brown fox", "Once upon a time there was"]):
        source.add_request(prompt, PARAMS, request_id=f"r{i}")
    for _ in range(3):
        source.step()
    path, sessions, _ = write_engine_checkpoint(source, "decode-0", WorkerRole.DECODE, current_compat(source, "cpu"),
                                                root, "decode-0", on_writer=lambda pid: None)
    assert sessions == 2
    return path


def continue_all(destination: LLMEngine) -> set[str]:
    continued: set[str] = set()
    while destination.has_unfinished():  # the sessions go on either way, with their KV or recomputed
        continued |= {out.request_id for out in destination.step()}
    return continued


@pytest.fixture(scope="module")
def int4_checkpoint(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoint_of_two_sessions(engine(tiny_model_dir, Quantization.INT4), tmp_path_factory.mktemp("int4"))


@pytest.mark.parametrize(("quantization", "mode"), [(Quantization.INT4, RestoreMode.RESTORED),
                                                    (Quantization.INT8, RestoreMode.COLD_START)])
def test_the_weight_format_decides_restore_or_cold_start(tiny_model_dir: Path, int4_checkpoint: Path,
                                                         quantization: Quantization, mode: RestoreMode) -> None:
    destination = engine(tiny_model_dir, quantization)
    result = restore_engine(destination, read_checkpoint(int4_checkpoint), current_compat(destination, "cpu"))
    assert result.mode is mode and result.sessions == 2
    if mode is RestoreMode.COLD_START:
        assert result.reason == "weights: checkpoint has 'int4-g32', destination has 'int8'"
    assert continue_all(destination) == {"r0", "r1"}


@pytest.mark.parametrize(("kv_dtype", "mode"), [(KVDtype.INT8, RestoreMode.RESTORED),
                                                (KVDtype.AUTO, RestoreMode.COLD_START)])
def test_the_kv_format_decides_restore_or_cold_start(tiny_model_dir: Path, tmp_path: Path, kv_dtype: KVDtype,
                                                     mode: RestoreMode) -> None:
    path = checkpoint_of_two_sessions(engine(tiny_model_dir, Quantization.NONE, KVDtype.INT8), tmp_path)
    assert read_checkpoint(path).manifest.compat.kv_dtype == "int8"
    destination = engine(tiny_model_dir, Quantization.NONE, kv_dtype)
    result = restore_engine(destination, read_checkpoint(path), current_compat(destination, "cpu"))
    assert result.mode is mode and result.sessions == 2
    if mode is RestoreMode.COLD_START:  # 8-bit rows never read as 16-bit values
        assert result.reason == "kv_dtype: checkpoint has 'int8', destination has 'auto'"
    assert continue_all(destination) == {"r0", "r1"}


def test_longrope_keys_rotated_by_the_long_factors_are_not_loaded_under_the_short_ones(
        family_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    def phi3(**settings: object) -> LLMEngine:
        options: dict = {"dtype": "float32", "num_kv_blocks": 64} | settings
        return LLMEngine(EngineConfig(model_dir=family_model_dirs["phi3"], settings=EngineSettings(**options)))

    path = checkpoint_of_two_sessions(phi3(), tmp_path)  # served to 512 positions: past the original 16
    assert read_checkpoint(path).manifest.compat.rope_factors == "long"
    short = phi3(max_model_len=16)
    result = restore_engine(short, read_checkpoint(path), current_compat(short, "cpu"))
    assert result.mode is RestoreMode.COLD_START
    assert result.reason == "rope_factors: checkpoint has 'long', destination has 'short'"
    assert continue_all(short) == {"r0", "r1"}
