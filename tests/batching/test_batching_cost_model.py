"""The online cost model: recovers coefficients, stays non-negative, learns from uniform sizes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.baselines import SeedCostModel
from gateway.batching import OnlineCostModel


def _noisy(rng: random.Random, a: float, b: float, tokens: int, jitter: float = 0.08) -> float:
    return (a + b * tokens) * (1.0 + (2.0 * rng.random() - 1.0) * jitter)


def test_recovers_intercept_and_slope_from_varied_batches() -> None:
    rng = random.Random(1)
    model = OnlineCostModel(0.005, 0.0001)  # a deliberately wrong prior
    for _ in range(400):
        tokens = rng.randrange(100, 4000)
        model.observe(tokens, _noisy(rng, 0.018, 0.000022, tokens))
    assert model.intercept == pytest.approx(0.018, rel=0.15)
    assert model.slope == pytest.approx(0.000022, rel=0.1)
    assert model.predict(2000) == pytest.approx(0.018 + 0.000022 * 2000, rel=0.03)
    snap = model.snapshot()
    assert (snap.intercept_s, snap.slope_s_per_token) == (model.intercept, model.slope)


def test_learns_when_every_batch_has_nearly_the_same_size() -> None:
    rng = random.Random(2)
    model = OnlineCostModel(0.005, 0.0001)
    seed = SeedCostModel(5.0, 0.1)  # the original model, in ms, for contrast
    for _ in range(300):
        tokens = 1000 + rng.randrange(-3, 4)
        seconds = _noisy(rng, 0.018, 0.000022, tokens, jitter=0.02)
        model.observe(tokens, seconds)
        seed.observe(tokens, seconds * 1000.0)
    truth = 0.018 + 0.000022 * 1000
    assert model.predict(1000) == pytest.approx(truth, rel=0.02)
    # The seed's conditioning guard never lets it refit on uniform batches: it stays at its prior.
    assert seed.predict(1000) == pytest.approx(5.0 + 0.1 * 1000)
    # Away from the observed size the prior keeps the extrapolation sane (positive, finite).
    assert 0.0 <= model.predict(10) < model.predict(4000) < 1.0


def test_forgets_old_behaviour() -> None:
    rng = random.Random(3)
    model = OnlineCostModel(0.018, 0.000022)
    for _ in range(200):
        tokens = rng.randrange(100, 4000)
        model.observe(tokens, _noisy(rng, 0.018, 0.000022, tokens))
    for _ in range(200):  # the device got 50% slower (a noisy neighbour arrived)
        tokens = rng.randrange(100, 4000)
        model.observe(tokens, _noisy(rng, 0.027, 0.000033, tokens))
    assert model.predict(2000) == pytest.approx(0.027 + 0.000033 * 2000, rel=0.05)


def test_spread_follows_the_noise() -> None:
    rng = random.Random(4)
    quiet, noisy = OnlineCostModel(0.018, 0.000022), OnlineCostModel(0.018, 0.000022)
    for _ in range(300):
        tokens = rng.randrange(100, 4000)
        quiet.observe(tokens, _noisy(rng, 0.018, 0.000022, tokens, jitter=0.01))
        noisy.observe(tokens, _noisy(rng, 0.018, 0.000022, tokens, jitter=0.25))
    assert quiet.upper_factor < 1.03 < noisy.upper_factor
    assert noisy.upper(1000) > noisy.predict(1000)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 100_000), st.floats(0.0, 50.0, allow_nan=False)),
        min_size=1,
        max_size=60,
    )
)
def test_coefficients_never_go_negative(samples: list[tuple[int, float]]) -> None:
    model = OnlineCostModel()
    for tokens, seconds in samples:
        model.observe(tokens, seconds)
        assert model.intercept >= 0.0
        assert model.slope >= 0.0


def test_decreasing_data_does_not_inflate_the_intercept() -> None:
    # Larger batches "faster" (nonsense data): the constrained fit pins the slope at zero and
    # the intercept at the mean, instead of an intercept inflated by a clamped negative slope.
    model = OnlineCostModel()
    for _ in range(50):
        model.observe(100, 0.050)
        model.observe(3000, 0.020)
    assert model.slope == 0.0
    assert 0.020 <= model.intercept <= 0.050


def test_rejects_nonsense_measurements() -> None:
    with pytest.raises(ValueError):
        OnlineCostModel().observe(10, -1.0)
    with pytest.raises(ValueError):
        OnlineCostModel(forgetting=1.5)
