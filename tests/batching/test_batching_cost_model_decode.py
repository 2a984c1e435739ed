"""The three-term cost model: ``(intercept + step × longest) + slope × tokens``.

It recovers all three coefficients of a decoding device, still the two of a device without a
decode loop (bit for bit when no batch reports a longest output), stays a true constrained
non-negative least squares, and follows a change of the step cost.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.batching import OnlineCostModel

# A small autoregressive decoder: 18 ms per batch, 0.02 ms per token, 0.3 ms per decode step.
TRUTH = (0.018, 0.00002, 0.0003)


def _decode_batch(rng: random.Random) -> tuple[int, int]:
    """A batch of 1..16 requests with varied prompts and output budgets: (tokens, longest)."""
    n = rng.choice([1, 1, 2, 4, 8, 16])
    outputs = [rng.randint(1, 512) for _ in range(n)]
    inputs = [rng.randint(8, 512) for _ in range(n)]
    return sum(inputs) + sum(outputs), max(outputs)


def _seconds(
    rng: random.Random, truth: tuple[float, float, float], tokens: int, longest: int
) -> float:
    a, b, c = truth
    return (a + b * tokens + c * longest) * (1.0 + (2.0 * rng.random() - 1.0) * 0.08)


def _mean_coefficients(
    model: OnlineCostModel, rng: random.Random, truth: tuple[float, float, float], n: int
) -> tuple[float, float, float]:
    seen: list[tuple[float, float, float]] = []
    for _ in range(n):
        tokens, longest = _decode_batch(rng)
        model.observe(tokens, _seconds(rng, truth, tokens, longest), longest)
        seen.append((model.intercept, model.slope, model.step))
    a, b, c = zip(*seen, strict=True)
    return statistics.fmean(a), statistics.fmean(b), statistics.fmean(c)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_all_three_coefficients_from_noisy_decode_batches(seed: int) -> None:
    rng = random.Random(seed)
    model = OnlineCostModel()  # the gateway's default prior: 10 ms, 0.05 ms/token, no step
    _mean_coefficients(model, rng, TRUTH, 1000)  # learn
    a, b, c = _mean_coefficients(model, rng, TRUTH, 500)  # then average the running fit
    assert a == pytest.approx(TRUTH[0], rel=0.08)
    assert b == pytest.approx(TRUTH[1], rel=0.05)
    assert c == pytest.approx(TRUTH[2], rel=0.05)
    # The running fit itself predicts an unseen batch shape well.
    expected = TRUTH[0] + TRUTH[1] * 3000 + TRUTH[2] * 400
    assert model.predict(3000, 400) == pytest.approx(expected, rel=0.05)
    assert model.snapshot().step_s == model.step == model.coefficients()[2]


def test_two_term_truth_with_decode_data_learns_no_step() -> None:
    rng = random.Random(7)
    truth = (0.018, 0.000022, 0.0)
    model = OnlineCostModel(0.005, 0.0001)  # a deliberately wrong prior
    _mean_coefficients(model, rng, truth, 1000)
    a, b, c = _mean_coefficients(model, rng, truth, 500)
    assert a == pytest.approx(truth[0], rel=0.1)
    assert b == pytest.approx(truth[1], rel=0.1)
    # Noise only (the constraint keeps it from averaging to 0 exactly): under 3 % of the
    # decoder's step, a few milliseconds over a 512-step decode against ~8 % batch jitter.
    assert c < 0.03 * TRUTH[2]
    assert model.predict(2500, 256) == pytest.approx(truth[0] + truth[1] * 2500, rel=0.05)


def test_the_prior_does_not_pull_the_split_where_the_data_has_none() -> None:
    # Every batch decodes exactly 256 steps: the data cannot split intercept from step, and
    # the prediction *at* 256 steps is what matters. It is right whatever the split.
    rng = random.Random(3)
    model = OnlineCostModel()
    for _ in range(800):
        tokens = rng.randint(300, 6000)
        model.observe(tokens, _seconds(rng, TRUTH, tokens, 256), 256)
    assert model.predict(2000, 256) == pytest.approx(
        TRUTH[0] + TRUTH[1] * 2000 + TRUTH[2] * 256, rel=0.05
    )
    assert min(model.coefficients()) >= 0.0


class _TwoTermReference:
    """The two-term model as it was before the step term (ADR 0001), verbatim arithmetic."""

    def __init__(self, a: float, b: float) -> None:
        self.g, half, t = 0.98, 0.5, 1024.0
        y0, y1 = a, a + b * t
        self.p = (2.0 * half, half * t, half * t * t, half * (y0 + y1), half * t * y1)
        self.a00, self.a01, self.a11, self.b0, self.b1 = self.p
        self.intercept, self.slope = a, b

    def observe(self, tokens: float, seconds: float) -> None:
        g, w = self.g, 1.0 - self.g
        p00, p01, p11, q0, q1 = self.p
        self.a00 = g * self.a00 + 1.0 + w * p00
        self.a01 = g * self.a01 + tokens + w * p01
        self.a11 = g * self.a11 + tokens * tokens + w * p11
        self.b0 = g * self.b0 + seconds + w * q0
        self.b1 = g * self.b1 + tokens * seconds + w * q1
        a00, a01, a11, b0, b1 = self.a00, self.a01, self.a11, self.b0, self.b1
        det = a00 * a11 - a01 * a01
        if det > 1e-12 * a00 * a11:
            i = (a11 * b0 - a01 * b1) / det
            s = (a00 * b1 - a01 * b0) / det
            if i >= 0.0 and s >= 0.0:
                self.intercept, self.slope = i, s
                return
        best = (0.0, 0.0, 0.0)
        s = max(0.0, b1 / a11) if a11 > 0 else 0.0
        if a11 * s * s - 2.0 * b1 * s < best[0]:
            best = (a11 * s * s - 2.0 * b1 * s, 0.0, s)
        i = max(0.0, b0 / a00) if a00 > 0 else 0.0
        if a00 * i * i - 2.0 * b0 * i < best[0]:
            best = (a00 * i * i - 2.0 * b0 * i, i, 0.0)
        self.intercept, self.slope = best[1], best[2]


def test_without_decode_data_it_is_the_two_term_model_bit_for_bit() -> None:
    # The published benchmark's device reports no output budgets: its numbers must not move.
    rng = random.Random(11)
    for _ in range(20):
        prior = (rng.random() * 0.05, rng.random() * 1e-4)
        model, reference = OnlineCostModel(*prior), _TwoTermReference(*prior)
        for _ in range(200):
            tokens = rng.choice([rng.randint(0, 9000), 100, 3000])
            seconds = rng.choice([(0.018 + 0.000022 * tokens) * rng.uniform(0.9, 1.1), 0.0])
            model.observe(tokens, seconds)
            reference.observe(tokens, seconds)
            assert (model.intercept, model.slope, model.step) == (
                reference.intercept,
                reference.slope,
                0.0,
            )
            assert model.predict(1234) == reference.intercept + reference.slope * 1234


def _faces_minimum(a: np.ndarray, b: np.ndarray) -> float:
    """Brute force: the best feasible face optimum of ``min θᵀAθ − 2bᵀθ, θ ≥ 0``."""
    best = 0.0  # the origin
    for size in (1, 2, 3):
        for face in itertools.combinations(range(3), size):
            idx = list(face)
            sub = a[np.ix_(idx, idx)]
            try:
                theta_f = np.linalg.solve(sub, b[idx])
            except np.linalg.LinAlgError:
                continue
            if (theta_f >= 0).all():
                theta = np.zeros(3)
                theta[idx] = theta_f
                best = min(best, float(theta @ a @ theta - 2.0 * b @ theta))
    return best


batches = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=20_000),  # tokens
        st.integers(min_value=0, max_value=2048),  # longest output
        st.floats(min_value=0.0, max_value=5.0, allow_nan=False),  # seconds, anything at all
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(batches)
def test_constrained_nnls_is_optimal_and_never_negative(
    observed: list[tuple[int, int, float]],
) -> None:
    model = OnlineCostModel()
    rng = random.Random(len(observed))
    for tokens, longest, seconds in observed:
        model.observe(tokens, seconds, longest)
        theta = model.coefficients()[:3]
        assert min(theta) >= 0.0
        assert model.predict(tokens, longest) >= 0.0
        assert model.upper(0) >= 0.0
    a_rows, b_vec = model.information()
    a, b = np.array(a_rows), np.array(b_vec)
    value = model.fit_objective(*theta)
    scale = 1e-9 * (abs(value) + float(np.abs(b).sum()) + 1e-12)
    # Not worse than the brute-force constrained optimum ...
    assert value <= _faces_minimum(a, b) + scale
    # ... nor than any boundary point: each face's clamped optimum and random points on it.
    for face in range(3):
        keep = [i for i in range(3) if i != face]
        sub = a[np.ix_(keep, keep)]
        if abs(np.linalg.det(sub)) > 0:
            point = np.zeros(3)
            point[keep] = np.clip(np.linalg.solve(sub, b[keep]), 0.0, None)
            assert value <= model.fit_objective(*point) + scale
        for _ in range(5):
            point = np.array([rng.uniform(0.0, 2.0) * (t + 1e-6) for t in theta])
            point[face] = 0.0
            assert value <= model.fit_objective(*point) + scale


def test_forgetting_follows_a_change_of_the_step_cost() -> None:
    rng = random.Random(5)
    model = OnlineCostModel(*TRUTH[:2], prior_step_s=TRUTH[2])
    _mean_coefficients(model, rng, TRUTH, 600)
    slower = (TRUTH[0], TRUTH[1], 2.0 * TRUTH[2])  # e.g. a noisy neighbour on the decode path
    _mean_coefficients(model, rng, slower, 300)  # ~6 forgetting windows
    _a, _b, c = _mean_coefficients(model, rng, slower, 200)
    assert c == pytest.approx(slower[2], rel=0.1)
    assert model.predict(2000, 300) == pytest.approx(
        slower[0] + slower[1] * 2000 + slower[2] * 300, rel=0.05
    )


def test_step_prior_and_validation() -> None:
    model = OnlineCostModel(0.01, 0.0001, prior_step_s=0.001)
    assert model.coefficients()[:3] == (0.01, 0.0001, 0.001)
    assert model.predict(100, 50) == pytest.approx(0.01 + 0.01 + 0.05)
    assert model.upper(100, 50) > model.predict(100, 50)
    assert model.mean_longest == 0.0
    model.observe(100, 0.07, 50)
    assert model.mean_longest == 50.0
    with pytest.raises(ValueError):
        OnlineCostModel(prior_step_s=-1.0)
    with pytest.raises(ValueError):
        OnlineCostModel().observe(10, 0.1, -1)
    assert math.isfinite(model.fit_objective(*model.coefficients()[:3]))
