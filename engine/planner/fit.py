"""Non-negative least squares in relative error for the planner's small linear cost models (2–3 terms):
every subset of the terms is solved and the best fit whose coefficients are all >= 0 kept, which is
exact for so few terms.

- Relative error, because a 50 ms step matters as much as a 3 s one; relative to the model's prediction
  (a few passes, each weighted by the last one's), not to the measurement: dividing by the measurement
  favours the points that came out fast and biases every time low, and a replay that underestimates
  service times underestimates queueing far more.
- A point much further off than the rest (a step stalled by something else on the machine) sits the
  next pass out, so that one stall does not tilt every time.
- A negative coefficient (a step that gets cheaper with more tokens) is noise that would turn into
  nonsense when a split is extrapolated, so it is never allowed."""

import itertools
from dataclasses import dataclass

import numpy as np

from fleetctl.errors import UserError

MIN_POINTS = 3
REWEIGHTS = 3  # passes, each weighting points by 1 / (the previous pass's prediction)²
OUTLIER_FACTOR, OUTLIER_FLOOR = 3.0, 0.25  # a point further off than this (relative) sits out the next pass


class FitError(UserError):
    """Too few (or degenerate) points to fit a model; the message says which and how many."""


@dataclass(frozen=True)
class LinearFit:
    terms: tuple[str, ...]  # what each coefficient multiplies, e.g. ("1", "tokens", "tokens²")
    coefficients: tuple[float, ...]
    points: int
    error: float  # mean relative error |predicted - measured| / measured, each point counted as often as it was

    def predict(self, *x: float) -> float:
        return sum(c * v for c, v in zip(self.coefficients, x, strict=True))

    def scaled(self, factor: float) -> "LinearFit":
        return LinearFit(self.terms, tuple(c * factor for c in self.coefficients), self.points, self.error)

    def as_json(self) -> dict[str, object]:
        return {"points": self.points, "error": round(self.error, 4),
                "coefficients": {t: c for t, c in zip(self.terms, self.coefficients, strict=True)}}


def fit_nonnegative(terms: tuple[str, ...], x: list[tuple[float, ...]], y: list[float],
                    counts: list[float] | None = None, what: str = "model") -> LinearFit:
    """y ≈ x · c with c >= 0, minimising Σ count · ((y - x·c) / x·c)²; `counts`: how many observations each
    point stands for (the steps of a request's decode), 1 each by default. Points with y <= 0 are left out."""
    keep = [i for i, value in enumerate(y) if value > 0]
    if len(keep) < MIN_POINTS:
        raise FitError(f"not enough measurements to fit the {what}: {len(keep)} point(s), need {MIN_POINTS}")
    a = np.array([x[i] for i in keep], dtype=float)
    b = np.array([y[i] for i in keep], dtype=float)
    n = np.array([counts[i] for i in keep] if counts else [1.0] * len(keep), dtype=float)
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    a = a / scale  # columns of similar size: tokens² is 10⁷ where the constant is 1
    guess, kept = b, np.ones(len(b), dtype=bool)
    for _ in range(REWEIGHTS):
        coef = _best_subset(a, b, kept * n / np.maximum(guess, b.min() / 10) ** 2)
        guess = a @ coef
        off = np.abs(b - guess) / np.maximum(guess, b.min() / 10)
        kept = off <= max(OUTLIER_FLOOR, OUTLIER_FACTOR * float(np.median(off)))
    error = float(np.sum(n * np.abs(guess - b) / b) / np.sum(n))
    return LinearFit(terms, tuple(float(c) for c in coef / scale), len(keep), error)


def _best_subset(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The coefficients (>= 0, zero for terms left out) of the best weighted fit over every subset of terms."""
    root = np.sqrt(w)
    best: tuple[float, np.ndarray] | None = None
    for size in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(range(a.shape[1]), size):
            cols = list(subset)
            solution, *_ = np.linalg.lstsq(a[:, cols] * root[:, None], b * root, rcond=None)
            if (solution < 0).any():
                continue
            coef = np.zeros(a.shape[1])
            coef[cols] = solution
            residual = float(np.sum(w * (a @ coef - b) ** 2))
            if best is None or residual < best[0]:
                best = (residual, coef)
    assert best is not None  # a single term of non-negative values always fits with a coefficient >= 0
    return best[1]
