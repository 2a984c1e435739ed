"""The published workload is reproduced exactly: fingerprints, checksum, first and last arrivals."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.workload import (
    RELAXED,
    URGENT,
    WorkloadSpec,
    build_trace,
    checksum,
    dump_trace,
    fingerprint,
    load_trace,
    round_half_up,
)
from common.rng import Mulberry32

# (rate, requests, sum of tokens, urgent requests) from the design card.
PUBLISHED = [
    (40, 4_794, 878_919, 1_470),
    (90, 10_788, 1_980_830, 3_258),
    (200, 23_901, 4_386_390, 7_242),
    (260, 31_207, 5_694_677, 9_341),
]
CHECKSUM_200 = "214eba02e9870c9ef9c1b1b673d60c885da2671ad8d4ce04d7cc8e00bbfae861"


@pytest.mark.parametrize(("rate", "requests", "tokens", "urgent"), PUBLISHED)
def test_trace_fingerprints_match_the_published_workload(
    rate: int, requests: int, tokens: int, urgent: int
) -> None:
    fp = fingerprint(build_trace(WorkloadSpec(rate=rate)))
    assert (fp.requests, fp.total_tokens, fp.urgent) == (requests, tokens, urgent)


def test_trace_at_200_matches_checksum_first_arrivals_and_last_arrival() -> None:
    trace = build_trace(WorkloadSpec(rate=200))
    assert checksum(trace) == CHECKSUM_200
    first = [(round(r.arrival_ms, 6), r.tokens, r.cohort) for r in trace[:3]]
    assert first == [(0.106841, 141, RELAXED), (0.673001, 231, RELAXED), (8.171909, 40, URGENT)]
    assert round(trace[-1].arrival_ms, 6) == 119_994.772361
    assert trace[2].deadline_ms == pytest.approx(trace[2].arrival_ms + 120.0)
    assert trace[0].deadline_ms == pytest.approx(trace[0].arrival_ms + 900.0)


def test_round_half_up_is_javascript_math_round() -> None:
    assert [round_half_up(x) for x in (0.5, 1.5, 2.5, -0.5, 2.4999)] == [1, 2, 3, 0, 2]


def test_mulberry32_stream_is_the_generator_the_trace_draws_from() -> None:
    # The first gap of the 200 req/s trace is -ln(1 - U1) * 5 ms with U1 the first draw.
    import math

    u1 = Mulberry32(0xC0FFEE).random()
    assert build_trace(WorkloadSpec(rate=200))[0].arrival_ms == -math.log(1 - u1) * 5.0


def test_other_seeds_and_shapes_change_the_trace_but_keep_its_contract() -> None:
    base = build_trace(WorkloadSpec(rate=200, duration_s=10))
    other = build_trace(WorkloadSpec(rate=200, duration_s=10, seed=7))
    assert checksum(base) != checksum(other)
    tight = build_trace(WorkloadSpec(rate=200, duration_s=10, urgent_share=1.0, urgent_slo_ms=50))
    assert all(
        r.cohort == URGENT and r.deadline_ms - r.arrival_ms == pytest.approx(50) for r in tight
    )
    for r in build_trace(WorkloadSpec(rate=200, duration_s=10, size_mu=9.0)):
        assert 16 <= r.tokens <= 4096


def test_bursty_arrivals_keep_the_draws_and_the_mean_rate() -> None:
    poisson = build_trace(WorkloadSpec(rate=200, duration_s=40))
    bursty = build_trace(WorkloadSpec(rate=200, duration_s=40, arrivals="bursty"))
    # Same per-request draws (sizes and cohorts), a different clock.
    assert [r.tokens for r in bursty] == [r.tokens for r in poisson][: len(bursty)]
    assert abs(len(bursty) - len(poisson)) < 0.05 * len(poisson)
    on = sum(1 for r in bursty if r.arrival_ms % 4000 < 2000)
    assert on > 0.9 * len(bursty)  # the default off phase runs at zero rate


def test_trace_files_round_trip(tmp_path: Path) -> None:
    trace = build_trace(WorkloadSpec(rate=90, duration_s=2))
    path = tmp_path / "trace.jsonl"
    dump_trace(trace, path)
    assert checksum(load_trace(path)) == checksum(trace)


def test_bad_trace_lines_are_reported_with_their_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"arrival_ms": 1, "tokens": 5, "deadline_ms": 9}\n{"tokens": 3}\n')
    with pytest.raises(ValueError, match=":2:"):
        load_trace(path)
