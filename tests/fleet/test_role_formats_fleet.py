"""A real fleet whose roles load different weight formats (`serve --prefill-quantization none
--decode-quantization int8`): each worker reports its role's format, and a request prefilled with 16-bit
weights and decoded with int8 ones streams the tokens of the same handoff done in-process by two engines."""

from pathlib import Path

import pytest
from support.fleet_harness import serve, start_streams, workers

from fleetctl.domain import Quantization
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.model.tokenizer import Tokenizer

pytestmark = pytest.mark.fleet  # real worker processes and a real server

PROMPT = "Prefill reads the prompt in one pass; decode writes the answer"
TOKENS = 24


def handed_off_in_process(model_dir: Path) -> str:
    """PROMPT prefilled by a prefill-only engine with dense weights, decoded by an int8 engine."""
    def engine(quantization: Quantization, prefill_only: bool) -> LLMEngine:
        settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=64, quantization=quantization)
        return LLMEngine(EngineConfig(model_dir=model_dir, settings=settings, prefill_only=prefill_only))

    prefill, decode = engine(Quantization.NONE, True), engine(Quantization.INT8, False)
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    seq = prefill.add_request(PROMPT, params, request_id="r")
    while "r" not in prefill.scheduler.parked:
        prefill.step()
    first_block, kv = prefill.export_kv("r")
    moved = decode.import_sequence("r", seq.prompt_token_ids, list(seq.output_token_ids), params, seq.seed, kv,
                                   first_block)
    while decode.has_unfinished():
        decode.step()
    return Tokenizer(model_dir).decode(moved.output_token_ids)


def test_prefill_and_decode_workers_load_their_roles_formats(tiny_model_dir: Path) -> None:
    expected = handed_off_in_process(tiny_model_dir)
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32",
               "--deterministic", "--kv-blocks", "64", "--prefill-quantization", "none",
               "--decode-quantization", "int8") as url:
        assert {wid: w["weights"] for wid, w in workers(url).items()} == {"prefill-0": "float32", "decode-0": "int8"}
        assert start_streams(url, [PROMPT], TOKENS, tiny_model_dir.name).result(timeout=120) == [expected]
