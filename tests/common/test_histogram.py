"""LatencyHistogram accuracy and merging, and the RotatingHistogram window."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.clock import ManualClock
from common.histogram import LatencyHistogram, RotatingHistogram, exact_quantile, quantile_rank

LOWEST, HIGHEST = 1e-6, 600.0
# The guarantee is exactly 1 %; the slack only absorbs floating-point rounding in log/exp.
TOLERANCE = 0.01 * (1 + 1e-9)

# Durations spread over the whole 1 us .. 10 min range (uniform floats would almost never
# produce microsecond values), plus the exact ends of the range.
durations = st.one_of(
    st.floats(math.log10(LOWEST), math.log10(HIGHEST)).map(lambda e: min(10.0**e, HIGHEST)),
    st.floats(LOWEST, HIGHEST),
    st.sampled_from([LOWEST, HIGHEST]),
)
sample_lists = st.lists(durations, min_size=1, max_size=200)
quantiles = st.one_of(st.sampled_from([0.0, 0.5, 0.9, 0.95, 0.99, 1.0]), st.floats(0.0, 1.0))


def histogram_of(values: list[float], **kwargs: float) -> LatencyHistogram:
    h = LatencyHistogram(**kwargs)
    for v in values:
        h.record(v)
    return h


def relative_error(got: float, want: float) -> float:
    return abs(got - want) / want


# -- the reference definition -----------------------------------------------------------------


def test_exact_quantile_is_the_sample_at_rank_ceil_q_n() -> None:
    samples = [4.0, 1.0, 3.0, 2.0]
    assert exact_quantile(samples, 0.0) == 1.0  # rank clamps up to 1
    assert exact_quantile(samples, 0.25) == 1.0
    assert exact_quantile(samples, 0.26) == 2.0
    assert exact_quantile(samples, 0.5) == 2.0
    assert exact_quantile(samples, 0.75) == 3.0
    assert exact_quantile(samples, 0.76) == 4.0
    assert exact_quantile(samples, 1.0) == 4.0
    assert exact_quantile([], 0.5) == 0.0
    assert quantile_rank(0.95, 100) == 95
    assert quantile_rank(0.951, 100) == 96
    with pytest.raises(ValueError):
        exact_quantile(samples, 1.01)


# -- accuracy ---------------------------------------------------------------------------------


@settings(max_examples=300)
@given(sample_lists, st.lists(quantiles, min_size=1, max_size=5))
def test_every_quantile_is_within_one_percent_of_the_exact_one(
    samples: list[float], qs: list[float]
) -> None:
    h = histogram_of(samples)
    for q in qs:
        assert relative_error(h.quantile(q), exact_quantile(samples, q)) <= TOLERANCE


@given(st.floats(0.0001, 0.1), sample_lists, quantiles)
def test_the_bound_follows_the_configured_relative_error(
    alpha: float, samples: list[float], q: float
) -> None:
    h = histogram_of(samples, relative_error=alpha)
    assert relative_error(h.quantile(q), exact_quantile(samples, q)) <= alpha * (1 + 1e-9)


def test_the_accuracy_check_has_teeth() -> None:
    # The sketch is not exact (so the 1 % bound is doing work), and a coarser sketch breaks it:
    # the accuracy property above would catch a histogram whose buckets were too wide.
    grid = [0.5 + i / 1000 for i in range(1000)]

    def worst_median_error(alpha: float) -> float:
        return max(
            relative_error(histogram_of([0.25, v, 2.0], relative_error=alpha).quantile(0.5), v)
            for v in grid
        )

    assert 0.005 < worst_median_error(0.01) <= TOLERANCE
    assert worst_median_error(0.05) > 0.04


def test_min_max_and_extreme_quantiles_are_exact() -> None:
    samples = [0.003, 0.0457, 1.2345, 0.0001]
    h = histogram_of(samples)
    assert h.min == 0.0001
    assert h.max == 1.2345
    assert h.quantile(0.0) == 0.0001
    assert h.quantile(1.0) == 1.2345


def test_a_single_value_reads_back_exactly_for_every_quantile() -> None:
    h = histogram_of([0.0421] * 10)
    assert {h.quantile(q) for q in (0.0, 0.3, 0.95, 1.0)} == {0.0421}


# -- statistics and edge cases ----------------------------------------------------------------


@given(sample_lists)
def test_count_total_mean_min_max_describe_the_samples(samples: list[float]) -> None:
    h = histogram_of(samples)
    assert h.count == len(samples)
    assert math.isclose(h.total, math.fsum(samples), rel_tol=1e-9)
    assert math.isclose(h.mean, math.fsum(samples) / len(samples), rel_tol=1e-9)
    assert h.min == min(samples)
    assert h.max == max(samples)


def test_empty_histogram_reads_zero() -> None:
    h = LatencyHistogram()
    assert (h.count, h.total, h.mean, h.min, h.max, h.quantile(0.95)) == (
        0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    )
    assert h.buckets() == []


def test_out_of_range_values_clamp_to_the_range() -> None:
    h = LatencyHistogram()
    h.record(0.0)
    h.record(1e-9)
    h.record(3600.0)
    h.record(math.inf)
    assert h.count == 4
    assert h.min == LOWEST
    assert h.max == HIGHEST
    assert h.quantile(0.5) == pytest.approx(LOWEST, rel=0.01)
    assert h.quantile(1.0) == HIGHEST
    assert h.total == pytest.approx(2 * LOWEST + 2 * HIGHEST)


@pytest.mark.parametrize("bad", [-1e-9, -1.0, math.nan, -math.inf])
def test_negative_or_nan_durations_are_refused(bad: float) -> None:
    h = LatencyHistogram()
    with pytest.raises(ValueError):
        h.record(bad)
    assert h.count == 0


def test_bad_arguments_are_refused() -> None:
    h = LatencyHistogram()
    with pytest.raises(ValueError):
        h.record(1.0, count=-1)
    for q in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError):
            h.quantile(q)
    for kwargs in ({"lowest": 0.0}, {"lowest": 2.0, "highest": 1.0}, {"relative_error": 0.0}):
        with pytest.raises(ValueError):
            LatencyHistogram(**kwargs)


def test_record_with_count_equals_repeated_records() -> None:
    once = LatencyHistogram()
    once.record(0.02, count=5)
    once.record(0.5, count=0)
    repeated = histogram_of([0.02] * 5)
    assert once.buckets() == repeated.buckets()
    assert (once.count, once.min, once.max) == (5, 0.02, 0.02)
    assert once.total == pytest.approx(repeated.total)


@given(sample_lists)
def test_buckets_partition_the_samples(samples: list[float]) -> None:
    h = histogram_of(samples)
    buckets = h.buckets()
    assert sum(c for _, c in buckets) == len(samples)
    bounds = [b for b, _ in buckets]
    assert bounds == sorted(set(bounds))
    gamma = 1.01 / 0.99
    for v in samples:
        holding = [b for b in bounds if b / gamma < v * (1 + 1e-12) and v <= b * (1 + 1e-12)]
        assert len(holding) >= 1


def test_copy_is_independent_and_reset_forgets() -> None:
    h = histogram_of([0.1, 0.2])
    dup = h.copy()
    dup.record(5.0)
    assert (h.count, dup.count) == (2, 3)
    assert h.max == 0.2
    h.reset()
    assert (h.count, h.quantile(0.5), h.buckets()) == (0, 0.0, [])
    assert dup.count == 3


# -- merging ----------------------------------------------------------------------------------


@given(st.lists(durations, max_size=100), st.lists(durations, max_size=100), quantiles)
def test_merge_equals_recording_the_union(a: list[float], b: list[float], q: float) -> None:
    merged = histogram_of(a)
    merged.merge(histogram_of(b))
    union = histogram_of(a + b)
    assert merged.count == union.count
    assert merged.buckets() == union.buckets()
    assert (merged.min, merged.max) == (union.min, union.max)
    assert math.isclose(merged.total, union.total, rel_tol=1e-9, abs_tol=1e-12)
    assert merged.quantile(q) == union.quantile(q)


def test_merging_incompatible_histograms_is_refused() -> None:
    h = LatencyHistogram()
    for other in (
        LatencyHistogram(relative_error=0.02),
        LatencyHistogram(lowest=1e-3),
        LatencyHistogram(highest=60.0),
    ):
        with pytest.raises(ValueError):
            h.merge(other)


def test_merge_does_not_alias_the_other_histogram() -> None:
    a, b = histogram_of([0.1]), histogram_of([0.2])
    a.merge(b)
    b.record(9.0)
    assert a.count == 2
    assert a.max == 0.2


# -- the rotating window ----------------------------------------------------------------------


def test_samples_leave_the_window_as_the_clock_passes_them() -> None:
    clock = ManualClock(0.0)
    window = RotatingHistogram(clock, window_s=10.0, slots=5)  # 2 s slots
    window.record(0.5)
    assert window.count == 1
    clock.set(9.999)
    assert window.count == 1  # slot [0, 2) is still the oldest live slot
    window.record(0.01)
    clock.set(10.0)
    assert window.count == 1  # slot [0, 2) fell out; the sample at 9.999 is live
    assert window.quantile(1.0) == 0.01
    clock.set(20.0)
    assert (window.count, window.quantile(0.95)) == (0, 0.0)


def test_recent_p95_follows_the_recent_samples() -> None:
    clock = ManualClock(0.0)
    window = RotatingHistogram(clock, window_s=10.0, slots=5)
    for _ in range(100):
        window.record(1.0)
    clock.set(9.0)
    for _ in range(100):
        window.record(0.01)
    assert window.quantile(0.95) == pytest.approx(1.0, rel=0.01)
    clock.set(10.5)
    assert window.quantile(0.95) == pytest.approx(0.01, rel=0.01)
    assert window.count == 100


class BackwardClock:
    """A clock whose readings can go backward, as skewed readings across threads can."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_a_backward_clock_reading_does_not_resurrect_an_expired_slot() -> None:
    clock = BackwardClock()
    window = RotatingHistogram(clock, window_s=1.0, slots=2)
    clock.t = 5.0
    window.record(0.1)
    clock.t = 0.2  # backward: keep writing into the newest slot
    window.record(0.2)
    assert window.count == 2
    clock.t = 6.0
    assert window.count == 0


@settings(max_examples=150)
@given(
    st.integers(1, 6),
    st.lists(st.tuples(st.floats(0.0, 4.0), durations), max_size=60),
    quantiles,
)
def test_the_window_equals_a_histogram_of_its_live_samples(
    slots: int, steps: list[tuple[float, float]], q: float
) -> None:
    window_s = 5.0
    width = window_s / slots
    clock = ManualClock(0.0)
    window = RotatingHistogram(clock, window_s=window_s, slots=slots)
    recorded: list[tuple[int, float]] = []
    for dt, value in steps:
        clock.advance(dt)
        window.record(value)
        recorded.append((math.floor(clock.now() / width), value))
        current = math.floor(clock.now() / width)
        live = [v for epoch, v in recorded if epoch > current - slots]
        reference = histogram_of(live)
        assert window.count == len(live)
        assert window.quantile(q) == reference.quantile(q)
        snapshot = window.snapshot()
        assert snapshot.buckets() == reference.buckets()
        assert (snapshot.min, snapshot.max) == (reference.min, reference.max)
        assert math.isclose(snapshot.total, reference.total, rel_tol=1e-9, abs_tol=1e-12)


def test_rotating_histogram_validates_its_shape_and_forwards_histogram_options() -> None:
    clock = ManualClock(0.0)
    with pytest.raises(ValueError):
        RotatingHistogram(clock, window_s=0.0)
    with pytest.raises(ValueError):
        RotatingHistogram(clock, slots=0)
    window = RotatingHistogram(clock, lowest=1e-3, highest=1.0)
    window.record(5.0)
    assert window.quantile(0.5) == 1.0  # clamped to the forwarded `highest`
    window.reset()
    assert window.count == 0
