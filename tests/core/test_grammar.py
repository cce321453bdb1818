"""Grammars: compiled once per grammar text, a matcher per sequence replayed over its output tokens (so a
sequence that lands elsewhere continues its mask exactly), and one clear error for what cannot be used. On the
tiny model's real byte-level BPE tokenizer."""

import json
from pathlib import Path

import llguidance
import pytest
import torch

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.grammar import MAX_GRAMMAR_BYTES, GrammarError, Grammars
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.logits_shaping import MaskJob, allowed_tokens
from fleetctl.engine.core.sampler import sample
from fleetctl.engine.core.sequence import SamplingParams, Sequence
from fleetctl.engine.model.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
GRAMMAR = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides={"whitespace_flexible": False})


@pytest.fixture(scope="module")
def grammars(tiny_model_dir: Path) -> Grammars:
    return Grammars(Tokenizer(tiny_model_dir), vocab_size=400)


def masks(grammars: Grammars, seqs: list[Sequence]) -> torch.Tensor:
    bitmask = MaskJob(grammars, seqs).result()
    assert bitmask is not None
    return allowed_tokens(bitmask, grammars.vocab_size)


def constrained(prompt: list[int], output: list[int] | None = None, temperature: float = 1.0,
                seed: int = 0) -> Sequence:
    params = SamplingParams(max_tokens=64, temperature=temperature, grammar=GRAMMAR)
    return Sequence(prompt, params, output_token_ids=list(output or []), seed=seed)


def decode_constrained(grammars: Grammars, seed: int) -> Sequence:
    """Draw from uniform logits under the mask until the grammar allows only EOS (or 64 tokens)."""
    seq = constrained([1, 2, 3], seed=seed)
    while len(seq.output_token_ids) < 64:
        [token] = sample(torch.zeros(1, grammars.vocab_size), [seq], grammars.eos_token_ids, MaskJob(grammars, [seq]))
        if token in grammars.eos_token_ids:
            break
        seq.append_token(token)
    return seq


def test_every_draw_under_the_mask_is_json_of_the_schema(grammars: Grammars, tiny_model_dir: Path) -> None:
    tokenizer = Tokenizer(tiny_model_dir)
    for seed in range(12):
        seq = decode_constrained(grammars, seed)
        value = json.loads(tokenizer.decode(seq.output_token_ids))
        assert set(value) == {"name", "n"} and isinstance(value["n"], int) and len(value["name"]) <= 8


def test_a_matcher_rebuilt_from_the_output_gives_the_same_mask(grammars: Grammars) -> None:
    """What a decode worker does after a handoff, a move, a restore or a recompute: a fresh Sequence object with
    the same output tokens, its matcher replayed over them."""
    original = decode_constrained(grammars, seed=3).output_token_ids
    walked = constrained([1, 2, 3])  # one matcher, advanced a token at a time
    for cut in range(len(original)):
        landed = constrained([1, 2, 3], original[:cut])  # a fresh one, replayed over the first `cut` tokens
        assert torch.equal(masks(grammars, [walked]), masks(grammars, [landed]))
        walked.append_token(original[cut])
    assert not masks(grammars, [constrained([1], [])]).all()  # the mask does restrict


def test_compiled_once_per_grammar_text(grammars: Grammars) -> None:
    grammar = llguidance.LLMatcher.grammar_from_regex("[a-c]{3,5}")
    first = grammars.compile(grammar)
    again = grammars.compile(grammar)
    assert again.seconds == 0.0 and again.matcher is first.matcher


def test_unusable_grammars_are_refused_with_the_reason(grammars: Grammars) -> None:
    with pytest.raises(GrammarError, match="does not compile"):
        grammars.compile(llguidance.LLMatcher.grammar_from_json_schema({"type": "object", "dependentSchemas": {}}))
    with pytest.raises(GrammarError, match="does not compile"):
        grammars.compile(llguidance.LLMatcher.grammar_from_lark("start: undefined_rule"))
    with pytest.raises(GrammarError, match=f"at most {MAX_GRAMMAR_BYTES:,}"):
        grammars.compile("x" * (MAX_GRAMMAR_BYTES + 1))


def test_an_output_that_broke_its_grammar_fails_that_sequence_only(grammars: Grammars, tiny_model_dir: Path) -> None:
    """A token the mask did not allow (sampled elsewhere without it): that sequence's mask raises, the batch's
    other rows are not touched (the worker re-runs them alone)."""
    broken = constrained([1], Tokenizer(tiny_model_dir).encode("nope"))
    with pytest.raises(GrammarError, match="broke its grammar"):
        MaskJob(grammars, [broken]).result()
    healthy = constrained([1])
    assert masks(grammars, [healthy]).any()


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_an_engine_samples_under_the_mask_and_penalties_on_its_device(tiny_model_dir: Path, device: str) -> None:
    """The mask (and the penalties beside it) applied to the logits where they are: every seeded sample is JSON of
    the schema; the free run of the same seeds is not."""
    engine = LLMEngine(EngineConfig(tiny_model_dir, device=device, settings=EngineSettings(dtype="float32")))
    prompts = [f"Name {i}:" for i in range(6)]
    held = SamplingParams(max_tokens=48, temperature=1.0, seed=5, grammar=GRAMMAR, frequency_penalty=0.3,
                          logit_bias=((5, 2.0),))
    for result in engine.generate(prompts, held):
        value = json.loads(result.text)
        assert set(value) == {"name", "n"} and isinstance(value["n"], int), result.text
    free = engine.generate(prompts, SamplingParams(max_tokens=48, temperature=1.0, seed=5))
    assert not any(result.text.startswith('{"name"') for result in free)
