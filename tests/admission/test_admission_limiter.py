"""Gradient limiter: once-per-window updates, sublinear growth, multiplicative decrease,
convergence, the floor, and no latency samples from failed, shed or cancelled requests."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission import GradientLimiter, GradientLimiterConfig

CFG = GradientLimiterConfig(
    initial_limit=10.0, min_limit=4.0, max_limit=500.0, window_s=1.0, min_window_samples=10
)


def drive(
    limiter: GradientLimiter,
    windows: int,
    latency: float | None = None,
    *,
    capacity: float | None = None,
    demand: int | None = None,
    start: float = 0.0,
    per_window: int = 50,
    noise: float = 0.0,
    seed: int = 1,
) -> tuple[float, list[float]]:
    """Closed-loop load: keep min(limit, demand) requests in flight; ``per_window`` complete
    per window with ``latency`` (x inflight / capacity once inflight exceeds capacity)."""
    rng = random.Random(seed)
    t = start
    history = []
    for _ in range(windows):
        for _ in range(per_window):
            t += limiter.config.window_s / per_window
            target = limiter.limit if demand is None else min(limiter.limit, demand)
            while limiter.inflight < target:
                limiter.acquire(t)
            n = limiter.inflight
            assert latency is not None
            lat = latency * (max(1.0, n / capacity) if capacity else 1.0)
            lat *= 1.0 + noise * (2.0 * rng.random() - 1.0)
            limiter.release(t, lat)
        history.append(limiter.exact_limit)
    return t, history


def test_updates_once_per_window_not_per_completion() -> None:
    lim = GradientLimiter(CFG, now=0.0)
    for i in range(1000):
        lim.acquire(i * 0.0009)
        lim.release(i * 0.0009, 0.05)
    assert lim.updates == 0 and lim.exact_limit == 10.0
    lim.acquire(1.0)
    assert lim.updates == 1
    for i in range(1000):
        lim.acquire(1.0 + i * 0.0009)
        lim.release(1.0 + i * 0.0009, 0.05)
    assert lim.updates == 1


def test_growth_is_sublinear_and_bounded_per_window() -> None:
    lim = GradientLimiter(CFG, now=0.0)
    _, history = drive(lim, 40, latency=0.05)
    previous = CFG.initial_limit
    for limit in history:
        assert limit - previous <= CFG.increase_gain * math.sqrt(previous) + 1e-9
        previous = limit
    assert history[-1] > 2 * CFG.initial_limit  # it does grow when the fleet keeps up


def test_converges_under_constant_latency() -> None:
    # Saturating demand: grows to the ceiling and stays exactly there.
    lim = GradientLimiter(CFG, now=0.0)
    _, history = drive(lim, 200, latency=0.05, noise=0.02)
    assert history[-50:] == [CFG.max_limit] * 50
    # Bounded demand: stops growing once it no longer binds, and stays put.
    lim = GradientLimiter(CFG, now=0.0)
    _, history = drive(lim, 200, latency=0.05, demand=30, noise=0.02)
    assert len(set(history[-100:])) == 1
    assert 30 <= history[-1] <= 2 * 30 + math.sqrt(60)


def test_backs_off_when_latency_doubles() -> None:
    lim = GradientLimiter(CFG, now=0.0)
    t, history = drive(lim, 60, latency=0.05, demand=100)
    before = history[-1]
    t, after = drive(lim, 3, latency=0.10, demand=100, start=t)
    assert min(after) <= 0.6 * before


def test_queue_slack_ignores_a_few_milliseconds_but_not_real_queueing() -> None:
    # A 2 ms fleet whose latency triples to 6 ms: a queue by the ratio, not worth refusing for.
    cfg = GradientLimiterConfig(
        initial_limit=10.0, min_limit=4.0, max_limit=500.0, queue_slack_s=0.025
    )
    lim = GradientLimiter(cfg, now=0.0)
    t, history = drive(lim, 20, latency=0.002, demand=100)
    before = history[-1]
    t, after = drive(lim, 5, latency=0.006, demand=100, start=t)
    assert min(after) >= before
    # The same tripling on a 50 ms fleet is a queue, slack or not.
    lim = GradientLimiter(cfg, now=0.0)
    t, history = drive(lim, 20, latency=0.05, demand=100)
    before = history[-1]
    t, after = drive(lim, 3, latency=0.15, demand=100, start=t)
    assert min(after) <= 0.6 * before
    with pytest.raises(ValueError, match="queue_slack_s"):
        GradientLimiterConfig(queue_slack_s=-1.0)


def test_settles_near_capacity_of_a_queueing_server() -> None:
    """Latency grows with concurrency past 50 slots: the limit settles in a band near 50."""
    lim = GradientLimiter(CFG, now=0.0)
    _, history = drive(lim, 300, latency=0.05, capacity=50, noise=0.05)
    tail = history[-150:]
    assert min(tail) >= 40 and max(tail) <= 65
    assert abs(sum(tail[:75]) / 75 - sum(tail[75:]) / 75) < 5  # no drift


def test_a_lasting_slowdown_is_re_baselined_not_cut_to_the_floor() -> None:
    lim = GradientLimiter(CFG, now=0.0)
    t, _ = drive(lim, 100, latency=0.05, capacity=50, noise=0.02)
    _, history = drive(lim, 60, latency=0.10, capacity=50, noise=0.02, start=t)
    assert min(history) > 2 * CFG.min_limit
    assert history[-1] >= 40


def test_floor_and_ceiling() -> None:
    cfg = GradientLimiterConfig(initial_limit=8, min_limit=6, max_limit=20, min_window_samples=5)
    lim = GradientLimiter(cfg, now=0.0)
    t = 0.0
    latency = 0.01
    seen = []
    for _ in range(30):  # latency keeps doubling: as bad as it gets
        latency *= 2
        t, _ = drive(lim, 1, latency=latency, start=t, per_window=10)
        seen.append(lim.exact_limit)
    assert min(seen) == 6
    lim = GradientLimiter(cfg, now=0.0)
    drive(lim, 100, latency=0.01, per_window=10)
    assert lim.exact_limit == 20


def test_failed_shed_and_cancelled_requests_never_feed_latency() -> None:
    lim = GradientLimiter(CFG, now=0.0)
    t, _ = drive(lim, 20, latency=0.05)
    t += CFG.window_s
    lim.acquire(t)  # judges the last window driven above (all successes)
    lim.release(t, None)
    short_before = lim.short_latency_s
    updates = lim.updates
    for i in range(5000):  # a fleet failing fast: 1 ms failures, released without a sample
        now = t + (i + 1) * 0.001
        lim.acquire(now)
        lim.release(now, None)
    assert lim.updates == updates  # no window ever had evidence: nothing was judged
    assert lim.short_latency_s == short_before
    assert lim.latency_estimate() == short_before


def drive_with_sheds(
    limiter: GradientLimiter,
    windows: int,
    *,
    latency: float,
    sheds: int,
    budget: float,
    start: float,
    successes: int = 40,
) -> tuple[float, list[float]]:
    """Keeps the limit full; per window ``successes`` answers at a flat ``latency`` (censored
    at the deadline: the slower ones were shed) and ``sheds`` queue sheds with ``budget``."""
    t = start
    history = []
    for _ in range(windows):
        n = successes + sheds
        for i in range(n):
            t += limiter.config.window_s / n
            while limiter.inflight < limiter.limit:
                limiter.acquire(t)
            if i % (n // sheds if sheds else n + 1) == 0 and sheds:
                limiter.release(t, None, queue_shed_budget_s=budget)
            else:
                limiter.release(t, latency)
        history.append(limiter.exact_limit)
    return t, history


def test_queue_sheds_cut_a_limit_whose_latency_sits_level() -> None:
    # Successes at the same latency as ever (what would have been slower was shed), while the
    # batcher sheds a fifth of the admitted work for the queue ahead: that is our queue.
    lim = GradientLimiter(CFG, now=0.0)
    t, history = drive(lim, 30, latency=0.05, demand=200)
    before, long_before = history[-1], lim.long_latency_s
    assert long_before is not None
    _, after = drive_with_sheds(lim, 4, latency=0.05, sheds=10, budget=2.0, start=t)
    # Cut by at least the shed share in every window wholly inside (the first straddles).
    assert all(b <= 0.85 * a for a, b in itertools.pairwise(after))
    assert after[-1] <= 0.85**3 * before
    assert lim.long_latency_s == long_before
    # The same windows without the sheds: the limit keeps growing.
    lim = GradientLimiter(CFG, now=0.0)
    t, history = drive(lim, 30, latency=0.05, demand=200)
    _, level = drive_with_sheds(lim, 4, latency=0.05, sheds=0, budget=2.0, start=t)
    assert level[-1] > history[-1]


def test_queue_sheds_count_against_the_fleet_floor_not_a_crept_up_long() -> None:
    # Under a lasting queue ``long`` creeps up towards the queue's latency (here 1.2 s, as
    # measured live); a 2 s budget is still ample for a fleet whose windows were 50 ms.
    lim = GradientLimiter(CFG, now=0.0)
    t, _ = drive(lim, 30, latency=0.05, demand=200)
    t, history = drive_with_sheds(lim, 1, latency=1.2, sheds=0, budget=2.0, start=t)
    before = history[-1]  # the window the 50 ms samples straddled is judged and gone
    lim._long = 1.2  # the creep, without the windows it takes
    _, after = drive_with_sheds(lim, 4, latency=1.2, sheds=10, budget=2.0, start=t)
    assert after[-1] <= 0.85**3 * before


def test_queue_sheds_of_requests_short_of_time_or_rare_change_nothing() -> None:
    def final(sheds: int, budget: float) -> float:
        lim = GradientLimiter(CFG, now=0.0)
        t, _ = drive(lim, 30, latency=0.05, demand=200)
        _, history = drive_with_sheds(lim, 4, latency=0.05, sheds=sheds, budget=budget, start=t)
        return history[-1]

    healthy = final(0, 2.0)
    # A budget an un-queued fleet would barely meet (< 2 x long): the request's own doing,
    # so a tenant sending tight deadlines cannot cut everyone's limit.
    assert final(10, 0.09) == healthy
    # One shed in 41 (under the 5 % share): not a queue.
    assert final(1, 2.0) == healthy


def test_release_without_acquire_is_an_error() -> None:
    lim = GradientLimiter(CFG, now=0.0)
    with pytest.raises(RuntimeError):
        lim.release(0.0, 0.01)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        GradientLimiterConfig(initial_limit=2, min_limit=4)
    with pytest.raises(ValueError):
        GradientLimiterConfig(tolerance=0.9)
    with pytest.raises(ValueError, match="queue_shed_share"):
        GradientLimiterConfig(queue_shed_share=0.0)
    with pytest.raises(ValueError, match="queue_shed_budget"):
        GradientLimiterConfig(queue_shed_budget=0.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.001, max_value=5.0), min_size=1, max_size=40))
def test_limit_stays_clamped_and_moves_by_bounded_steps(latencies: list[float]) -> None:
    lim = GradientLimiter(CFG, now=0.0)
    t = 0.0
    for latency in latencies:
        before = lim.exact_limit
        t, _ = drive(lim, 1, latency=latency, start=t, per_window=12)
        after = lim.exact_limit
        assert CFG.min_limit <= after <= CFG.max_limit
        assert after <= before + CFG.increase_gain * math.sqrt(before) + 1e-9
        assert after >= max(CFG.min_limit, before * CFG.min_gradient) - 1e-9
