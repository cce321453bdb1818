"""sample(): greedy rows, and seeded draws that depend only on (seed, output position)."""

import torch

from fleetctl.engine.core.sampler import position_seed, sample
from fleetctl.engine.core.sequence import SamplingParams, Sequence

VOCAB = 50


def make_seq(params: SamplingParams, seed: int = 1234, num_output: int = 0) -> Sequence:
    return Sequence([1, 2, 3], params, output_token_ids=[5] * num_output, seed=seed)


def flat_logits(rows: int = 1, vocab: int = VOCAB) -> torch.Tensor:
    """Uniform rows: every token equally likely, so a draw reveals the generator's state."""
    return torch.zeros(rows, vocab, dtype=torch.float32)


def random_logits(rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def test_greedy_rows_take_argmax() -> None:
    logits = random_logits(4)
    seqs = [make_seq(SamplingParams(temperature=0.0), seed=i) for i in range(4)]
    assert sample(logits, seqs) == logits.argmax(dim=-1).tolist()


def test_greedy_ignores_seed_and_position() -> None:
    logits = random_logits(1)
    expected = int(logits.argmax())
    for seed, n in [(0, 0), (1, 0), (7, 5)]:
        assert sample(logits, [make_seq(SamplingParams(temperature=0.0), seed=seed, num_output=n)]) == [expected]


def test_returns_python_ints_one_per_row() -> None:
    logits = random_logits(3)
    seqs = [make_seq(SamplingParams(temperature=0.0)), make_seq(SamplingParams(seed=3)), make_seq(SamplingParams())]
    out = sample(logits, seqs)
    assert len(out) == 3
    assert all(type(t) is int and 0 <= t < VOCAB for t in out)


def test_seeded_draw_is_reproducible() -> None:
    logits = flat_logits()
    params = SamplingParams(temperature=1.0)
    first = [sample(logits, [make_seq(params, seed=42, num_output=n)])[0] for n in range(20)]
    again = [sample(logits, [make_seq(params, seed=42, num_output=n)])[0] for n in range(20)]
    assert first == again


def test_seeded_draw_is_independent_of_row_and_batch() -> None:
    params = SamplingParams(temperature=1.0)
    row = random_logits(1, seed=9)[0]
    for seed in range(10):
        for position in (0, 3):
            target = make_seq(params, seed=seed, num_output=position)
            alone = sample(row.unsqueeze(0), [target])[0]
            # placed last among other sampled and greedy rows with different logits
            others = [
                make_seq(params, seed=1000 + seed),
                make_seq(SamplingParams(temperature=0.0)),
                make_seq(SamplingParams(temperature=0.7, top_k=5), seed=55, num_output=2),
            ]
            batch = torch.cat([random_logits(3, seed=seed + 1), row.unsqueeze(0)])
            assert sample(batch, [*others, target])[3] == alone
            # and first
            batch = torch.cat([row.unsqueeze(0), random_logits(3, seed=seed + 2)])
            assert sample(batch, [target, *others])[0] == alone


def test_two_rows_with_the_same_seed_and_position_draw_the_same() -> None:
    params = SamplingParams(temperature=1.0)
    logits = flat_logits(2, vocab=1000)
    a, b = make_seq(params, seed=77, num_output=4), make_seq(params, seed=77, num_output=4)
    first, second = sample(logits, [a, b])
    assert first == second


def test_different_positions_give_different_draws() -> None:
    params = SamplingParams(temperature=1.0)
    logits = flat_logits(vocab=1000)
    draws = [sample(logits, [make_seq(params, seed=5, num_output=n)])[0] for n in range(50)]
    # with a fixed RNG state per position, all 50 would be equal; uniform over 1000 they rarely repeat
    assert len(set(draws)) >= 40


def test_different_seeds_give_different_draws() -> None:
    params = SamplingParams(temperature=1.0)
    logits = flat_logits(vocab=1000)
    draws = [sample(logits, [make_seq(params, seed=s)])[0] for s in range(50)]
    assert len(set(draws)) >= 40


def test_position_seed_separates_seed_and_position() -> None:
    seeds = {position_seed(s, p) for s in range(20) for p in range(20)}
    assert len(seeds) == 400
    assert all(0 <= s < (1 << 63) for s in seeds)


def test_top_k_one_equals_argmax() -> None:
    logits = random_logits(8, seed=3)
    seqs = [make_seq(SamplingParams(temperature=1.5, top_k=1), seed=s) for s in range(8)]
    assert sample(logits, seqs) == logits.argmax(dim=-1).tolist()


def test_top_k_keeps_only_the_k_most_likely() -> None:
    logits = random_logits(1, seed=4)
    allowed = set(torch.topk(logits[0], 3).indices.tolist())
    params = SamplingParams(temperature=2.0, top_k=3)
    draws = {sample(logits, [make_seq(params, seed=s)])[0] for s in range(200)}
    assert draws == allowed  # every one of the 3 is drawn at temperature 2, nothing else


def test_tiny_top_p_keeps_only_the_most_likely_token() -> None:
    logits = random_logits(1, seed=5)
    best = int(logits.argmax())
    params = SamplingParams(temperature=2.0, top_p=1e-6)
    assert {sample(logits, [make_seq(params, seed=s)])[0] for s in range(100)} == {best}


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps the first two (0.5 < 0.75 <= 0.8)
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    logits = probs.log()
    params = SamplingParams(temperature=1.0, top_p=0.75)
    draws = {sample(logits, [make_seq(params, seed=s)])[0] for s in range(300)}
    assert draws == {1, 3}


def test_low_temperature_sharpens_to_argmax() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.9, 0.8, 0.7]])
    cold = SamplingParams(temperature=0.01)
    assert {sample(logits, [make_seq(cold, seed=s)])[0] for s in range(200)} == {1}
    warm = SamplingParams(temperature=1.0)
    # at temperature 1 the near-equal logits spread the draws
    assert len({sample(logits, [make_seq(warm, seed=s)])[0] for s in range(200)}) == 5


def test_temperature_changes_the_distribution_monotonically() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0, 0.0]])

    def share_of_best(temperature: float) -> float:
        params = SamplingParams(temperature=temperature)
        draws = [sample(logits, [make_seq(params, seed=s)])[0] for s in range(600)]
        return draws.count(0) / len(draws)

    # p(best) = e^(2/T) / (e^(2/T) + 3): T=0.5 -> 0.95, T=1 -> 0.71, T=2 -> 0.48
    cold, mid, hot = share_of_best(0.5), share_of_best(1.0), share_of_best(2.0)
    assert cold > 0.88 and 0.6 < mid < 0.82 and 0.36 < hot < 0.6


def test_sampling_does_not_modify_the_logits() -> None:
    logits = random_logits(2, seed=6)
    before = logits.clone()
    sample(logits, [make_seq(SamplingParams(temperature=0.5, top_k=3, top_p=0.5)), make_seq(SamplingParams())])
    assert torch.equal(logits, before)


def test_tiny_positive_temperature_acts_greedily() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    seqs = [make_seq(SamplingParams(temperature=0.0)), make_seq(SamplingParams(temperature=1e-38), seed=1)]
    assert sample(logits.expand(2, -1).contiguous(), seqs) == [1, 1]
