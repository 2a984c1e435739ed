"""Metrics every process shares or that changed shape: ``halcyon_build_info`` on every
component, the worker's series labelled with the model and version it serves, and the gateway's
dropped outcome reports as a counter (``_total``) read from the controller link's own count.

Real ``halcyon`` processes on 127.0.0.1:0 (the end-to-end launcher) for what each process
exports; an in-process gateway for the dropped-outcome count, which needs 50,000 outcomes
buffered against an unreachable controller to move.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.build_info import BUILD_INFO, halcyon_version
from common.raw_unary import fast_path_refusal
from common.serving import ServingOptions
from gateway.admission import TenantRegistry
from gateway.app import GatewayApp, GatewayConfig
from gateway.controller_link import MAX_BUFFERED_OUTCOMES
from halcyon.v1 import control_pb2
from tests.support import e2e

REPO = Path(__file__).resolve().parents[2]
DROPPED = "halcyon_gateway_dropped_outcome_reports"
# What serves the gateway's Infer and the worker's ExecuteBatch here unless forced to aio.
FAST_OR_AIO = "fast" if fast_path_refusal() is None else "aio"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A controller, a worker forced onto grpc.aio (``replica-aio``) and a gateway."""
    launcher = e2e.Launcher(tmp_path_factory.mktemp("process-metrics"))
    try:
        yield launcher.fleet({"replica-aio": (*e2e.INSTANT, "--serving-path", "aio")})
    finally:
        launcher.close()


def _families(proc: Any) -> dict[str, Any]:
    families: dict[str, Any] = e2e.scrape(proc)
    return families


@pytest.mark.parametrize(
    ("component", "serving_path"),
    [("controller", "aio"), ("gateway", FAST_OR_AIO), ("replica-aio", "aio")],
)
def test_every_process_says_what_it_runs(fleet: Any, component: str, serving_path: str) -> None:
    proc = {"controller": fleet.controller, "gateway": fleet.gateway, **fleet.workers}[component]
    info = _families(proc)[BUILD_INFO]
    assert info.type == "gauge"
    assert [(s.labels, s.value) for s in info.samples] == [
        (
            {
                "component": "worker" if component.startswith("replica") else component,
                "version": halcyon_version(),
                "grpcio": grpc.__version__,
                "serving_path": serving_path,
            },
            1.0,
        )
    ]


def test_every_worker_series_carries_its_model_and_version(fleet: Any) -> None:
    fleet.infer(session_key="labels")
    families = _families(fleet.workers["replica-aio"])
    worker = {n: f for n, f in families.items() if n.startswith("halcyon_worker_")}
    assert {
        "halcyon_worker_batches",
        "halcyon_worker_batch_device_seconds",
        "halcyon_worker_batch_size",
        "halcyon_worker_batch_tokens",
        "halcyon_worker_busy_slots",
        "halcyon_worker_slots",
        "halcyon_worker_draining",
        "halcyon_worker_controller_connected",
        "halcyon_worker_controller_reconnects",
    } <= set(worker)
    for name, family in worker.items():
        assert family.samples, name
        for s in family.samples:
            assert (s.labels.get("model"), s.labels.get("version")) == (e2e.MODEL, "v1"), s
    assert e2e.sample(families, "halcyon_worker_batches_total", model=e2e.MODEL, outcome="ok") >= 1


def test_the_gateways_dropped_outcomes_are_a_counter(fleet: Any) -> None:
    families = _families(fleet.gateway)
    assert families[DROPPED].type == "counter"
    assert [(s.name, s.value) for s in families[DROPPED].samples] == [(f"{DROPPED}_total", 0.0)]


async def test_dropped_outcomes_are_counted_where_they_are_dropped() -> None:
    app = GatewayApp(
        GatewayConfig(
            fleet_token="fleet",
            tenants=TenantRegistry.demo(),
            controller="127.0.0.1:1",  # nobody answers: every report stays queued
            serving=ServingOptions(listen="127.0.0.1:0", metrics_listen=None, grace_s=1.0),
        )
    )
    await app.start()
    try:
        registry, link = app.host.registry, app.link
        assert link is not None
        assert registry.get_sample_value(f"{DROPPED}_total") == 0
        ok = control_pb2.RequestOutcomeKind.REQUEST_OUTCOME_KIND_OK
        for _ in range(MAX_BUFFERED_OUTCOMES + 3):  # a full buffer drops its oldest
            link.record_request("resnet", "v1", "r1", ok, 0.01)
        assert registry.get_sample_value(f"{DROPPED}_total") == 3
        link._queue_report()  # the queued report holds MAX_BUFFERED_OUTCOMES outcomes
        link.record_batch(control_pb2.BatchOutcome(model="resnet", version="v1", size=1))
        link._queue_report()  # over the bound: the oldest report goes, all of it counted
        assert registry.get_sample_value(f"{DROPPED}_total") == 3 + MAX_BUFFERED_OUTCOMES
        assert registry.get_sample_value(DROPPED) is None  # no gauge of the old name
    finally:
        with contextlib.suppress(Exception):
            await app.shutdown(grace_s=0.1)
        await app.host.stop(0)


def test_the_family_parses_as_a_counter_in_the_text_format() -> None:
    # The exposition a scraper reads: "# TYPE <name>_total counter" and one "<name>_total" sample.
    from prometheus_client import CollectorRegistry, generate_latest

    from common.buffered_metrics import ScrapeHooks
    from gateway.metrics import GatewayMetrics

    registry = CollectorRegistry()
    hooks = ScrapeHooks()
    registry.register(hooks)
    metrics = GatewayMetrics(registry, hooks)
    total = [41]
    metrics.dropped_outcomes.read_from(lambda: total[0])
    total[0] += 1
    text = generate_latest(registry).decode()
    assert f"# TYPE {DROPPED}_total counter" in text
    assert f"{DROPPED}_total 42.0" in text.splitlines()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == DROPPED]
    assert family.type == "counter"
