"""On the real default models: a strict JSON schema holds every seeded sample at temperature 1.0, on smollm2-135m
and on gemma3-270m (whose 262k-token vocabulary makes the mask 32 KB a row), in one batch per model."""

import json
from pathlib import Path

import pytest

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.server.response_format import json_schema_grammar

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "population": {"type": "integer", "minimum": 0},
    "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3},
    "climate": {"enum": ["cold", "mild", "hot"]}},
    "required": ["city", "population", "landmarks", "climate"], "additionalProperties": False}
SEEDS = 20


def valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == set(SCHEMA["required"]) and isinstance(value["city"], str)
            and len(value["city"]) <= 24 and isinstance(value["population"], int) and value["population"] >= 0
            and isinstance(value["landmarks"], list) and len(value["landmarks"]) <= 3
            and all(isinstance(x, str) and len(x) <= 24 for x in value["landmarks"])
            and value["climate"] in ("cold", "mild", "hot"))


@pytest.mark.parametrize("model", ["smollm2_dir", "gemma3_dir"])
def test_every_seeded_sample_holds_the_schema(model: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(model)
    engine = LLMEngine(EngineConfig(model_dir, settings=EngineSettings(dtype="bfloat16")))
    prompt = "Describe a city you like as JSON with its name, population, landmarks and climate.\n"
    held = [engine.add_request(prompt, SamplingParams(max_tokens=120, temperature=1.0, seed=seed,
                                                      grammar=json_schema_grammar(SCHEMA))) for seed in range(SEEDS)]
    texts = {seq.request_id: "" for seq in held}
    reasons = {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] += out.text_delta
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    cut = [rid for rid, reason in reasons.items() if reason == "length"]
    assert len(cut) <= 1, cut  # answers end by themselves (bounded strings, at most three landmarks)
    invalid = [text for rid, text in texts.items() if rid not in cut and not valid(text)]
    assert not invalid, invalid
