"""``halcyon loadtest --mix``: SLO classes, request shapes and the figures a sweep reads.

The live counterpart (``run_loadtest`` against an in-process gateway per batching strategy) is
in ``tests/gateway/test_batching_strategies.py``.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from collections import Counter
from dataclasses import fields

import pytest

from halcyon.tools.loadtest import (
    ClassTally,
    LoadGenerator,
    LoadOptions,
    LoadResult,
    SloClass,
    Tally,
    _request_pool,
    configure,
    parse_mix,
    parse_range,
    render,
    summarize,
)
from halcyon.v1 import infer_pb2


def test_a_mix_is_parsed_and_its_shares_normalised() -> None:
    assert parse_mix("urgent:0.3:800,relaxed:0.7:6000") == (
        SloClass("urgent", 0.3, 800.0),
        SloClass("relaxed", 0.7, 6000.0),
    )
    halves = parse_mix("a:1:100, b:1:200")
    assert [c.share for c in halves] == [0.5, 0.5]
    for bad in ("urgent:0.3", "x:0:100", "x:1:-5", "x:1:100,x:1:200", ":1:100", "x:y:100"):
        with pytest.raises(ValueError):
            parse_mix(bad)


def test_ranges() -> None:
    assert parse_range("64:255") == (64, 255)
    assert parse_range("7:7") == (7, 7)
    for bad in ("64", "0:10", "10:5", "a:b"):
        with pytest.raises(ValueError):
            parse_range(bad)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser


def test_the_library_options_are_the_flags() -> None:
    parser = _parser()
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == {f.name for f in fields(LoadOptions)}
    # ...with the same defaults.
    assert LoadOptions.from_args(parser.parse_args([])) == LoadOptions()
    args = parser.parse_args(
        ["--mix", "u:0.3:800,r:0.7:6000", "--max-tokens", "16:32", "--input-bytes", "100:400",
         "--worker-metrics", "127.0.0.1:9461,127.0.0.1:9462", "--rate", "50"]
    )  # fmt: skip
    options = LoadOptions.from_args(args)
    assert options.classes == parse_mix("u:0.3:800,r:0.7:6000")
    assert options.max_tokens == (16, 32) and options.input_bytes == (100, 400)
    assert options.worker_metrics == ("127.0.0.1:9461", "127.0.0.1:9462")
    assert "mix u:0.3:800,r:0.7:6000" in options.mode and "open loop 50" in options.mode
    assert LoadOptions().classes == (SloClass("default", 1.0, 2000.0),)
    assert LoadOptions(input_bytes=(1, 1 << 20)).problem() is not None
    assert LoadOptions(rate=-1).problem() is not None


def test_a_bad_mix_is_a_one_line_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "halcyon", "loadtest", "--mix", "urgent:0.3"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "not NAME:SHARE:DEADLINE_MS" in proc.stderr and "Traceback" not in proc.stderr


def test_classes_are_drawn_by_share_reproducibly() -> None:
    gen = LoadGenerator(LoadOptions(mix=parse_mix("u:0.3:800,r:0.7:6000")))
    try:
        draws = [gen._draw_class(random.Random(5)) for _ in range(3)]
        assert len(set(draws)) == 1  # the same seed, the same class
        rng = random.Random(1)
        counts = Counter(gen._draw_class(rng) for _ in range(20_000))
        assert counts[0] / 20_000 == pytest.approx(0.3, abs=0.02)
        assert gen._deadlines_s == [0.8, 6.0]
    finally:
        gen.close()
    single = LoadGenerator(LoadOptions())
    try:
        rng = random.Random(1)
        before = rng.getstate()
        assert single._draw_class(rng) == 0
        assert rng.getstate() == before  # one class draws nothing: today's sequence unchanged
    finally:
        single.close()


def test_request_shapes_follow_the_ranges() -> None:
    pool = _request_pool("m", "s", random.Random(3), 200, (16, 20), (300, 310))
    requests = [infer_pb2.InferRequest.FromString(b) for b in pool]
    assert all(16 <= r.max_output_tokens <= 20 for r in requests)
    assert all(300 <= len(r.input.encode()) <= 310 for r in requests)
    # The default stays the original mix: 4 to 16 words, 64 to 255 tokens.
    default = [
        infer_pb2.InferRequest.FromString(b) for b in _request_pool("m", "s", random.Random(3))
    ]
    assert all(4 <= len(r.input.split()) <= 16 for r in default)
    assert all(64 <= r.max_output_tokens <= 255 for r in default)


def test_the_report_per_class_and_admitted_then_late() -> None:
    classes = parse_mix("urgent:0.5:100,relaxed:0.5:1000")
    urgent = ClassTally(
        offered=10,
        ok=6,
        on_time=4,
        refused=2,
        late=3,
        lost=1,
        latencies_ms=[50.0] * 4 + [150.0] * 2,
    )
    relaxed = ClassTally(offered=10, ok=10, on_time=10, latencies_ms=[500.0] * 10)
    tally = Tally(classes=[urgent, relaxed], refused=2, admitted_late=3, on_time=14)
    tally.outcomes.update(
        {"OK": 16, "RESOURCE_EXHAUSTED/QUOTA_EXCEEDED": 2, "DEADLINE_EXCEEDED": 1}
    )
    tally.outcomes["DEADLINE_EXCEEDED/DEADLINE_MISSED"] += 1
    tally.latencies_ms = urgent.latencies_ms + relaxed.latencies_ms
    tally.batch_sizes = [4] * 16
    tally.rejected.update({"QUOTA_EXCEEDED": 2, "DEADLINE_MISSED": 1})
    report = summarize(tally, 12.0, None, classes=classes, window_s=10.0, workers_cpu_s=2.0)
    assert report["offered"] == 20 and report["requests"] == 20
    assert report["admitted"] == 18 and report["admitted_late"] == 3
    assert report["admitted_late_share"] == pytest.approx(3 / 18)
    assert report["goodput_window_rps"] == pytest.approx(1.4)  # over the 10 s window
    assert report["goodput_rps"] == pytest.approx(14 / 12)  # over the wall time, as before
    assert report["worker_cpu_s"] == 2.0 and report["gateway_cpu_ms_per_request"] is None
    first = report["classes"][0]
    assert (first["name"], first["offered"], first["succeeded"], first["on_time"]) == (
        "urgent", 10, 6, 4,
    )  # fmt: skip
    assert first["on_time_share"] == pytest.approx(0.4)
    assert first["p99_ms"] == 150.0
    result = LoadResult.from_report("test", report)
    assert result.goodput_rps == pytest.approx(1.4)
    assert result.classes[1].on_time_share == 1.0
    assert result.worker_cpu_ms_per_request == pytest.approx(2000.0 / 19)
    text = render(report)
    assert "class urgent" in text and "4 on time (40.0%) within 100 ms" in text
    assert "3 of 18 admitted" in text and "worker CPU" in text
