"""The planner's least squares: exact on exact data, never a negative term, a clear refusal with too few points."""

import random

import pytest

from fleetctl.engine.planner.fit import FitError, fit_nonnegative

TERMS = ("1", "tokens", "tokens²")


def test_recovers_the_coefficients_of_exact_data() -> None:
    x = [(1.0, t, t * t) for t in (64, 300, 900, 1500, 2600)]
    y = [0.02 + 4e-4 * t + 5e-8 * t2 for _, t, t2 in x]
    fit = fit_nonnegative(TERMS, x, y)
    assert fit.coefficients == pytest.approx((0.02, 4e-4, 5e-8), rel=1e-6)
    assert fit.points == 5 and fit.error == pytest.approx(0.0, abs=1e-9)
    assert fit.predict(1.0, 1000, 1e6) == pytest.approx(0.02 + 0.4 + 0.05)


def test_a_term_the_data_would_make_negative_is_dropped() -> None:
    # time falls slightly with the square term: unconstrained least squares would give it a negative weight
    x = [(1.0, t, t * t) for t in (100, 200, 400, 800, 1600)]
    y = [0.05 + 1e-3 * t - 1e-8 * t * t for _, t, _ in x]
    fit = fit_nonnegative(TERMS, x, y)
    assert all(c >= 0 for c in fit.coefficients)
    assert fit.coefficients[2] == 0.0
    assert fit.error < 0.05


def test_noise_gives_a_nonzero_error_and_counts_weigh_points() -> None:
    rng = random.Random(1)
    x = [(1.0, b, b * 300.0) for b in range(1, 40)]
    y = [(0.03 + 2e-3 * b) * rng.uniform(0.9, 1.1) for _, b, _ in x]
    fit = fit_nonnegative(("1", "batch", "context"), x, y, counts=[10.0] * len(x))
    assert 0.01 < fit.error < 0.1
    assert fit.predict(1.0, 20, 6000) == pytest.approx(0.07, rel=0.1)


def test_too_few_points_is_one_clear_error() -> None:
    with pytest.raises(FitError, match=r"not enough measurements to fit the decode model: 2 point\(s\), need 3"):
        fit_nonnegative(TERMS, [(1.0, 1, 1), (1.0, 2, 4), (1.0, 3, 9)], [0.1, 0.2, 0.0], what="decode model")
