"""BufferedCounter + ScrapeHooks: a scrape sees every increment made before it, exactly once."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram

from common.buffered_metrics import BufferedCounter, LoopHistogram, ScrapeHooks


def registry_with(counter_name: str) -> tuple[CollectorRegistry, BufferedCounter]:
    registry = CollectorRegistry()
    hooks = ScrapeHooks()
    registry.register(hooks)  # first: flushes before the family below is read
    family = Counter(counter_name, "test", ["kind"], registry=registry)
    buffered = BufferedCounter(family.labels("a"))
    hooks.add_counters([buffered])
    return registry, buffered


def test_a_scrape_sees_increments_made_before_it() -> None:
    registry, counter = registry_with("hits")
    assert registry.get_sample_value("hits_total", {"kind": "a"}) == 0.0
    for _ in range(5):
        counter.inc()
    assert registry.get_sample_value("hits_total", {"kind": "a"}) == 5.0
    counter.inc()
    assert registry.get_sample_value("hits_total", {"kind": "a"}) == 6.0
    # Scraping again without new increments hands nothing over twice.
    assert registry.get_sample_value("hits_total", {"kind": "a"}) == 6.0


def test_concurrent_scrapes_do_not_double_count() -> None:
    registry, counter = registry_with("hits")
    for _ in range(1000):
        counter.inc()
    threads = [
        threading.Thread(target=registry.get_sample_value, args=("hits_total", {"kind": "a"}))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert registry.get_sample_value("hits_total", {"kind": "a"}) == 1000.0


def test_registering_hooks_collects_nothing() -> None:
    hooks = ScrapeHooks()
    calls: list[int] = []
    hooks.add(lambda: calls.append(1))
    CollectorRegistry().register(hooks)
    assert calls == []
    assert hooks.collect() == [] and calls == [1]


@given(st.lists(st.floats(0.0, 100.0, allow_nan=False), max_size=60))
def test_loop_histogram_exposes_what_a_prometheus_histogram_would(values: list[float]) -> None:
    buckets = (0.001, 0.01, 0.1, 1.0, 10.0)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LoopHistogram("lat_seconds", "t", ["m"], buckets=buckets, registry=ours)
    ref = Histogram("lat_seconds", "t", ["m"], buckets=buckets, registry=theirs)
    for v in values:
        mine.labels("x").observe(v)
        ref.labels("x").observe(v)

    def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        out = {}
        for family in registry.collect():
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out[(s.name, s.labels.get("le", ""))] = s.value
        return out

    got, want = samples(ours), samples(theirs)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key
