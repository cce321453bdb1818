"""Speculative decoding (engine/core/speculation.py and the runner's verification): prompt lookup's drafts, which of
them stand, how far a step drafts, and — on real models — the same tokens with speculation as without, nothing of the
pool leaked."""

from pathlib import Path

import pytest

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, SpeculativeMode
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams, Sequence
from fleetctl.engine.core.speculation import (
    EXPLORE_EVERY,
    PRIOR_ACCEPTANCE,
    PRIOR_ROW_COST,
    Acceptance,
    NgramIndex,
    Speculator,
    StepCost,
    accepted,
    draft_lengths,
)


def test_prompt_lookup_drafts_what_followed_the_latest_longest_match() -> None:
    tokens = [5, 6, 7, 8, 1, 2, 6, 7, 9, 3, 5, 6, 7]  # suffix (5, 6, 7) seen at 0; (6, 7) last seen at 6
    assert NgramIndex().propose(tokens, 3) == [8, 1, 2]  # the longer match wins over the later, shorter one
    assert NgramIndex().propose([1, 2, 3, 4, 9, 9, 3, 4], 5) == [9, 9, 3, 4]  # to the end of what there is
    assert NgramIndex().propose([1, 2, 3, 4], 4) == []  # nothing repeats
    assert NgramIndex().propose([4, 4, 4, 4], 2) == [4]  # (4, 4, 4) last came before the final 4


def test_the_index_grows_with_the_sequence() -> None:
    index, tokens = NgramIndex(), [1, 2, 3, 4]
    assert index.propose(tokens, 2) == []
    tokens += [1, 2]
    assert index.propose(tokens, 2) == [3, 4]
    tokens += [7, 8, 1, 2]
    assert index.propose(tokens, 2) == [7, 8]  # the latest occurrence of (1, 2)


def test_a_draft_stands_up_to_its_first_token_the_model_would_not_draw() -> None:
    assert accepted([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]  # all stand: the model's own next token too
    assert accepted([4, 5, 6], [4, 9, 6, 7]) == [4, 9]  # 5 was not drawn: 9 is, and nothing after it
    assert accepted([4, 5, 6], [8, 5, 6, 7]) == [8]
    assert accepted([], [3]) == [3]


def test_a_step_drafts_while_the_rows_pay_for_themselves() -> None:
    assert draft_lengths([0.9], [8], 0.3)[0] >= 4  # likely drafts at batch 1: several rows
    assert draft_lengths([0.1], [8], 0.3) == [0]  # unlikely ones: none
    assert draft_lengths([0.9], [2], 0.3) == [2]  # no more than proposed
    assert draft_lengths([0.6] * 32, [8] * 32, 0.3) == [0] * 32  # a big batch: a row costs more than it returns
    assert draft_lengths([0.6] * 32, [8] * 32, 0.001) != [0] * 32  # unless rows are nearly free (a GPU)
    mixed = draft_lengths([0.95, 0.2], [4, 4], 0.3)
    assert mixed[0] > 0 and mixed[1] == 0


def test_acceptance_follows_recent_steps_and_drifts_back_to_the_prior() -> None:
    acceptance = Acceptance()
    assert acceptance.rate() == pytest.approx(PRIOR_ACCEPTANCE)
    for _ in range(10):
        acceptance.observe(drafted=4, kept=0)
    low = acceptance.rate()
    assert low < 0.2
    for _ in range(40):
        acceptance.observe(drafted=0, kept=0)  # steps without a draft
    assert low < acceptance.rate() == pytest.approx(PRIOR_ACCEPTANCE, abs=0.05)


def test_step_cost_fits_what_a_row_costs() -> None:
    cost = StepCost()
    assert cost.row_cost() == PRIOR_ROW_COST
    for rows in [1, 3, 5, 2, 4, 1, 6, 2, 3, 5]:
        cost.observe(rows, 0.010 + 0.002 * rows)
    assert cost.row_cost() == pytest.approx(0.2)
    same = StepCost()
    for _ in range(20):
        same.observe(4, 0.02)  # one batch size only: no slope to fit
    assert same.row_cost() == PRIOR_ROW_COST


def test_sequences_that_shape_their_logits_do_not_draft() -> None:
    speculator = Speculator(4, 512)
    tokens = [1, 2, 3, 4, 1, 2]
    plain = Sequence(tokens[:3], SamplingParams(max_tokens=8), output_token_ids=tokens[3:])
    penalized = Sequence(tokens[:3], SamplingParams(max_tokens=8, presence_penalty=0.5), output_token_ids=tokens[3:])
    with_logprobs = Sequence(tokens[:3], SamplingParams(max_tokens=8, logprobs=1), output_token_ids=tokens[3:])
    speculator.draft([plain], 1000)
    assert plain.draft_token_ids == [3, 4]  # the two rows the prior acceptance pays for at batch 1
    speculator.draft([penalized, with_logprobs], 1000)
    assert penalized.draft_token_ids == [] == with_logprobs.draft_token_ids
    speculator.draft([plain], 8)  # room for one: the context (8) after its 6 tokens and the step's own
    assert plain.draft_token_ids == [3]


PROMPTS = ["a b c d e f a b c d e f a b c", "def f(x):\n    return x\ndef f(x):\n", "one two one two one"]


def _run(model_dir: Path, speculative: SpeculativeMode, params: SamplingParams,
         **settings: object) -> tuple[list[list[int]], int, int, LLMEngine]:
    engine = LLMEngine(EngineConfig(model_dir, settings=EngineSettings(
        dtype="float32", num_kv_blocks=64, speculative=speculative, speculative_tokens=6, **settings)))
    seqs = [engine.add_request(prompt, params) for prompt in PROMPTS]
    drafted = kept = 0
    while engine.has_unfinished():
        engine.step()
        drafted, kept = drafted + sum(engine.last_step.drafted), kept + sum(engine.last_step.accepted)
    return [seq.output_token_ids for seq in seqs], drafted, kept, engine


def test_greedy_tokens_are_the_same_with_prompt_lookup(tiny_model_dir: Path) -> None:
    """Under --deterministic a row's numbers do not depend on its neighbours, so each verified position draws what
    a plain decode step draws there."""
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    plain, _, _, _ = _run(tiny_model_dir, SpeculativeMode.NONE, params, deterministic=True)
    speculated, drafted, kept, engine = _run(tiny_model_dir, SpeculativeMode.NGRAM, params, deterministic=True)
    assert speculated == plain
    assert drafted > 0 and kept > 0  # drafts were verified, and some stood
    assert engine.kv_cache.allocator.num_used == 0  # every draft's block given back


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_right_drafts_stand_and_wrong_ones_change_nothing(tiny_model_dir: Path, temperature: float,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Drafts from an oracle (the plain run's own next tokens, every other draft's last one made wrong), each
    verified whole: sampled tokens too are the plain run's (a draw is seeded by its output position), the right
    tokens all stand, and a wrong one ends its draft."""
    params = SamplingParams(max_tokens=40, temperature=temperature, seed=3, ignore_eos=True)
    plain, _, _, plain_engine = _run(tiny_model_dir, SpeculativeMode.NONE, params, deterministic=True)
    expected = {tuple(plain_engine.encode_prompt(prompt)): out for prompt, out in zip(PROMPTS, plain, strict=True)}
    calls = [0]

    def oracle(_self: Speculator, seq: Sequence, limit: int) -> list[int]:
        done = len(seq.output_token_ids)
        draft = list(expected[tuple(seq.prompt_token_ids)][done:done + limit])  # from the token the step draws
        calls[0] += 1
        if draft and calls[0] % 2:
            draft[-1] = (draft[-1] + 1) % 300
        return draft

    monkeypatch.setattr(Speculator, "_propose", oracle)
    monkeypatch.setattr("fleetctl.engine.core.speculation.draft_lengths", lambda _rates, proposed, _cost: proposed)
    engine = LLMEngine(EngineConfig(tiny_model_dir, settings=EngineSettings(
        dtype="float32", num_kv_blocks=64, speculative=SpeculativeMode.NGRAM, speculative_tokens=5,
        deterministic=True)))
    seqs = [engine.add_request(prompt, params) for prompt in PROMPTS]
    drafted = kept = 0
    while engine.has_unfinished():
        engine.step()
        drafted, kept = drafted + sum(engine.last_step.drafted), kept + sum(engine.last_step.accepted)
    assert [seq.output_token_ids for seq in seqs] == plain
    assert 0 < kept < drafted  # right drafts stood, wrong ones were cut
    assert engine.kv_cache.allocator.num_used == 0


def test_every_family_keeps_its_tokens(family_model_dirs: dict[str, Path]) -> None:
    """Families whose K/V has a sliding window do not draft (their windows' slots are not grown for drafts)."""
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    for family, model_dir in family_model_dirs.items():
        plain, _, _, _ = _run(model_dir, SpeculativeMode.NONE, params, deterministic=True)
        speculated, drafted, _, engine = _run(model_dir, SpeculativeMode.NGRAM, params, deterministic=True)
        assert speculated == plain, family
        assert (drafted > 0) == (engine.kv_window is None), family


def test_a_sequence_kept_from_drafting_tries_one_token_now_and_then() -> None:
    """Where drafts do not pay by the prior (a big batch), a sequence with a proposal still verifies one token every
    EXPLORE_EVERY steps: its acceptance is measured, and the pool's becomes the next sequences' prior."""
    speculator = Speculator(4, 512)
    seqs = [Sequence([1, 2, 3], SamplingParams(max_tokens=64), output_token_ids=[1, 2], request_id=f"r{i}")
            for i in range(32)]
    lengths = []
    for _ in range(EXPLORE_EVERY):
        speculator.draft(seqs, 1000)
        lengths.append([len(seq.draft_token_ids) for seq in seqs])
    assert lengths[:-1] == [[0] * 32] * (EXPLORE_EVERY - 1) and lengths[-1] == [1] * 32
    speculator.observe(tuple(s.request_id for s in seqs), (1,) * 32, (1,) * 32, 64, 0.05)
    assert speculator.pooled.rate() > PRIOR_ACCEPTANCE
