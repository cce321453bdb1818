"""Speculation keeps the sampled distribution at temperature > 0: over many unseeded requests (each its own random
seed), the tokens drawn at each output position are as frequent with drafts verified as without — a chi-square test
of homogeneity per position. The drafts are the likeliest tokens (the plain run's most frequent at each position), so
about half of them stand and a rule that kept a draft it should not have would crowd its token in."""

import math
import random
from collections import Counter
from pathlib import Path

import pytest

from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, SpeculativeMode
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams, Sequence
from fleetctl.engine.core.speculation import Speculator

REQUESTS, TOKENS = 400, 6
PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
Z_999 = 3.09  # the standard normal's 99.9th percentile: a false alarm once in a thousand seedings per position


def chi2_critical(df: int, z: float = Z_999) -> float:
    """The chi-square distribution's quantile at the normal quantile `z` (Wilson–Hilferty: good from df ≥ 1)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def homogeneity(a: Counter[int], b: Counter[int], min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's chi-square of two samples' token counts, and its degrees of freedom; tokens too rare to test alone
    (an expected count under `min_expected`) pooled into one."""
    n_a, n_b = sum(a.values()), sum(b.values())
    common = {t for t in a.keys() | b.keys() if (a[t] + b[t]) * min(n_a, n_b) / (n_a + n_b) >= min_expected}
    cells = [(a[t], b[t]) for t in common]
    cells.append((n_a - sum(a[t] for t in common), n_b - sum(b[t] for t in common)))
    cells = [c for c in cells if sum(c) > 0]
    chi2 = 0.0
    for count_a, count_b in cells:
        total = count_a + count_b
        for count, n in ((count_a, n_a), (count_b, n_b)):
            expected = total * n / (n_a + n_b)
            chi2 += (count - expected) ** 2 / expected
    return chi2, len(cells) - 1


def sampled(model_dir: Path, speculative: SpeculativeMode, seeds: int) -> tuple[list[list[int]], tuple[int, int]]:
    """Each request's output tokens, and how many drafted tokens were verified and how many stood. The requests
    give no seed: each draws its own from Python's `random`, seeded with `seeds` so that the test is repeatable (the
    two runs take different seeds: the same ones would give the same tokens, speculated or not)."""
    random.seed(seeds)
    engine = LLMEngine(EngineConfig(model_dir, settings=EngineSettings(
        dtype="float32", num_kv_blocks=512, speculative=speculative, speculative_tokens=3, deterministic=True)))
    params = SamplingParams(max_tokens=TOKENS, temperature=0.3, ignore_eos=True)  # no seed: each request its own
    seqs = [engine.add_request(PROMPT, params) for _ in range(REQUESTS)]
    drafted = kept = 0
    while engine.has_unfinished():
        engine.step()
        drafted, kept = drafted + sum(engine.last_step.drafted), kept + sum(engine.last_step.accepted)
    assert engine.kv_cache.allocator.num_used == 0  # every rejected draft's slots given back
    return [seq.output_token_ids for seq in seqs], (drafted, kept)


def test_drafts_verified_at_temperature_keep_every_positions_distribution(tiny_model_dir: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    plain, _ = sampled(tiny_model_dir, SpeculativeMode.NONE, seeds=1)
    modes = [Counter(out[i] for out in plain).most_common(1)[0][0] for i in range(TOKENS)]

    def likeliest(_self: Speculator, seq: Sequence, limit: int) -> list[int]:
        done = len(seq.output_token_ids)
        return modes[done:done + limit]  # from the token the step draws itself

    monkeypatch.setattr(Speculator, "_propose", likeliest)
    monkeypatch.setattr("fleetctl.engine.core.speculation.draft_lengths", lambda _rates, proposed, _cost: proposed)
    speculated, (drafted, kept) = sampled(tiny_model_dir, SpeculativeMode.NGRAM, seeds=2)
    assert drafted > REQUESTS and 0.1 * drafted < kept < 0.9 * drafted, (drafted, kept)  # verified, many stood
    for i in range(TOKENS):
        chi2, df = homogeneity(Counter(out[i] for out in plain), Counter(out[i] for out in speculated))
        assert df >= 1 and chi2 < chi2_critical(df), (i, chi2, df)
