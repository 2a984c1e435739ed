"""BufferedCounter + ScrapeHooks: a scrape sees every increment made before it, exactly once."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter

from common.buffered_metrics import BufferedCounter, ScrapeHooks


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
