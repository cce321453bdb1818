"""An engine re-laid for another role in place (`LLMEngine.switch_role`, what `fleetctl switch` runs in the worker):
a prefill engine switched to decode generates what an engine that loaded to decode does, its prefix cache kept;
switched back it parks sequences after their prefill again; a switch between roles that decode keeps what it holds
decoding, token for token; and to or from prefill it refuses while it holds a sequence."""

from pathlib import Path

import pytest

from fleetctl.engine.core.engine_settings import CompileMode, EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import EngineBusy, LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

PROMPT = "Prefill reads the prompt in one pass; decode writes the answer a token at a time. " * 2
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def make_engine(model_dir: Path, prefill_only: bool) -> LLMEngine:
    settings = EngineSettings(dtype="float32", num_kv_blocks=64, compile=CompileMode.OFF)
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=settings, prefill_only=prefill_only))


def test_a_prefill_engine_switched_to_decode_decodes_and_back_parks_again(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, prefill_only=True)
    ids = engine.tokenizer.encode(PROMPT)
    engine.add_request(ids, GREEDY, request_id="parked")
    engine.step()
    assert "parked" in engine.scheduler.parked  # a prefill engine: its sequence waits for a handoff
    engine.release("parked")

    engine.switch_role(prefill_only=False)
    assert engine.cached_prefix_tokens(ids) > 0  # the blocks it computed as a prefill engine are still cached
    tokens = engine.generate([ids], GREEDY)[0].token_ids
    assert tokens == make_engine(tiny_model_dir, prefill_only=False).generate([ids], GREEDY)[0].token_ids
    assert not engine.has_unfinished() and not engine.scheduler.parked

    engine.switch_role(prefill_only=True)
    engine.add_request(ids, GREEDY, request_id="again")
    engine.step()
    assert "again" in engine.scheduler.parked


def test_a_switch_is_refused_while_the_engine_holds_a_sequence(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, prefill_only=False)
    engine.add_request(engine.tokenizer.encode(PROMPT), GREEDY, request_id="held")
    with pytest.raises(EngineBusy, match=r"holds 1 sequence\(s\): a switch to or from prefill needs it empty"):
        engine.switch_role(prefill_only=True)
    assert not engine.config.prefill_only
    engine.step()
    assert "held" not in engine.scheduler.parked  # it still decodes what it holds


def test_a_switch_between_roles_that_decode_keeps_its_sequences_decoding(tiny_model_dir: Path) -> None:
    """A decode engine re-laid as mixed (prefill_only stays False) mid-answer: the answer is the undisturbed one."""
    ids = make_engine(tiny_model_dir, prefill_only=False).tokenizer.encode(PROMPT)
    undisturbed = make_engine(tiny_model_dir, prefill_only=False).generate([ids], GREEDY)[0].token_ids
    engine = make_engine(tiny_model_dir, prefill_only=False)
    engine.add_request(ids, GREEDY, request_id="kept")
    tokens: list[int] = []
    for step in range(GREEDY.max_tokens + 1):
        if step == 4:
            engine.switch_role(prefill_only=False)
        tokens += [out.token_id for out in engine.step() if out.request_id == "kept" and out.token_id is not None]
        if not engine.has_unfinished():
            break
    assert tokens == undisturbed
