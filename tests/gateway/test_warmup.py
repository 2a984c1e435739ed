"""A replica's warm-up seeds its cost model: the first prediction is the device's real cost,
from a 1 ms device to a 30 s one (pure: a simulated device on a manual clock, no sleeps)."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.clock import ManualClock
from common.cost_samples import CostSampleValue
from common.rng import SeededRng
from gateway.routing import AttemptPolicy
from gateway.warmup import fit_line, prior_latency_s, seeded_cost_model
from worker.faults import FaultInjector
from worker.runtime import SimulatedDevice


def warm_up(
    intercept_ms: float,
    ms_per_token: float,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    faults: FaultInjector | None = None,
) -> tuple[SimulatedDevice, tuple[CostSampleValue, ...]]:
    """The simulated device's own warm-up, run on a manual clock (no real sleep)."""
    clock = ManualClock()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    device = SimulatedDevice(
        intercept_ms=intercept_ms,
        ms_per_token=ms_per_token,
        jitter=jitter,
        seed=seed,
        clock=clock,
        sleep=sleep,
        faults=faults,
    )
    return device, asyncio.run(device.warm_up())


# Devices from 1 ms to 30 s a batch, with a per-token cost from none to heavy.
INTERCEPTS_MS = st.floats(1.0, 30_000.0)
PER_TOKEN_MS = st.one_of(st.just(0.0), st.floats(0.0001, 10.0))
SIZES = (0, 16, 100, 512, 2048, 4096, 8192)


@settings(max_examples=200, deadline=None)
@given(INTERCEPTS_MS, PER_TOKEN_MS)
def test_without_jitter_the_seeded_prediction_is_the_device_cost_at_every_size(
    intercept_ms: float, ms_per_token: float
) -> None:
    device, samples = warm_up(intercept_ms, ms_per_token)
    model = seeded_cost_model(samples)
    assert model is not None and model.observations == len(samples) >= 2
    for tokens in SIZES:
        real = device.estimate_s(tokens)
        assert model.predict(tokens) == pytest.approx(real, rel=0.02, abs=1e-6)
        assert model.upper(tokens) >= real * 0.999  # conservative where it must be
        # ... so the first batch's attempt timeout leaves the device its real time.
        assert AttemptPolicy().attempt_timeout(model.upper(tokens)) >= 4.0 * real * 0.999


@settings(max_examples=200, deadline=None)
@given(INTERCEPTS_MS, PER_TOKEN_MS, st.integers(0, 2**31))
def test_with_jitter_the_seeded_prediction_is_within_the_jitter_where_it_was_measured(
    intercept_ms: float, ms_per_token: float, seed: int
) -> None:
    jitter = 0.08  # the simulated device's default
    device, samples = warm_up(intercept_ms, ms_per_token, jitter=jitter, seed=seed)
    model = seeded_cost_model(samples)
    assert model is not None
    lo, hi = min(s.batch_tokens for s in samples), max(s.batch_tokens for s in samples)
    for tokens in (lo, (lo + hi) // 2, hi):
        real = device.estimate_s(tokens)
        assert model.predict(tokens) == pytest.approx(real, rel=jitter + 0.05)
        # The first attempt (4 x the conservative prediction) outlasts any real batch.
        assert 4.0 * model.upper(tokens) >= real * (1.0 + jitter)


def test_warm_up_never_injects_a_fault_but_a_slowdown_is_measured() -> None:
    broken = FaultInjector(fail_rate=1.0, hang_rate=1.0, rng=SeededRng(1))
    _, samples = warm_up(20.0, 0.0, faults=broken)
    assert [s.seconds for s in samples] == pytest.approx([0.020, 0.020])
    slow = FaultInjector(slowdown=3.0, rng=SeededRng(1))
    _, samples = warm_up(20.0, 0.0, faults=slow)
    assert [s.seconds for s in samples] == pytest.approx([0.060, 0.060])


def test_the_router_prior_is_the_measured_batch_time() -> None:
    _, samples = warm_up(5000.0, 0.0)
    assert prior_latency_s(samples) == pytest.approx(5.0)
    _, instant = warm_up(0.0, 0.0)
    assert prior_latency_s(instant) == pytest.approx(1e-4)  # never zero: a call costs that
    assert prior_latency_s(()) is None


def sample(tokens: int, seconds: float) -> CostSampleValue:
    return CostSampleValue(items=1, batch_tokens=tokens, longest_output_tokens=0, seconds=seconds)


def test_the_line_is_non_negative_and_unusable_samples_are_ignored() -> None:
    assert fit_line([sample(10, 1.0), sample(100, 2.0)]) == pytest.approx((8 / 9, 1 / 90))
    assert fit_line([sample(10, 2.0), sample(100, 1.0)]) == pytest.approx((1.5, 0.0))  # flat
    assert fit_line([sample(10, 0.1), sample(100, 10.0)])[0] == 0.0  # type: ignore[index]
    assert fit_line([sample(64, 3.0), sample(64, 5.0)]) == pytest.approx((4.0, 0.0))
    assert fit_line([sample(64, math.nan), sample(64, -1.0)]) is None
    assert seeded_cost_model([]) is None
