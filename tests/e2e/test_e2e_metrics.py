"""Prometheus /metrics of the gateway, a worker and the controller, scraped over HTTP.

Counters are compared before and after this test's own traffic, so the assertions hold
whatever other tests did to the shared fleet.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import pytest

pytestmark = pytest.mark.e2e

INFER = {"grpc_service": "halcyon.v1.InferService", "grpc_method": "Infer", "grpc_type": "unary"}
CALLS = 12


def _buckets(families: Any, name: str, **labels: str) -> dict[str, float]:
    """The cumulative ``le`` buckets of a histogram (children matching ``labels``)."""
    found: dict[str, float] = {}
    for family in families.values():
        for s in family.samples:
            if s.name == f"{name}_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
                found[s.labels["le"]] = found.get(s.labels["le"], 0.0) + s.value
    return found


def test_metrics_reflect_traffic(fleet: Any, e2e: SimpleNamespace) -> None:
    procs = {"gateway": fleet.gateway, "controller": fleet.controller, **fleet.workers}
    before = {name: e2e.scrape(proc) for name, proc in procs.items()}

    served_by: set[str] = set()
    for i in range(CALLS):
        served_by.add(fleet.infer(session_key=f"metrics-{i}").replica_id)
    for _ in range(2):
        err = e2e.rich_error(lambda: fleet.infer(key="wrong-key"))
        assert err.code == grpc.StatusCode.UNAUTHENTICATED
    err = e2e.rich_error(lambda: fleet.infer(model="no-such-model"))
    assert err.code == grpc.StatusCode.NOT_FOUND
    fleet.get_state()
    handled = "grpc_server_handled_total"
    control = {"grpc_service": "halcyon.v1.ControlService", "grpc_method": "GetState"}

    def settled() -> dict[str, Any] | None:
        # A server counts a call once its answer is on its way: the client can hold the
        # answer a moment before the count lands (a loaded machine widens that moment).
        now = {name: e2e.scrape(proc) for name, proc in procs.items()}
        gateway = sum(
            e2e.sample(now["gateway"], handled, **INFER, grpc_code=code)
            - e2e.sample(before["gateway"], handled, **INFER, grpc_code=code)
            for code in ("OK", "Unauthenticated", "NotFound")
        )
        controller = e2e.sample(now["controller"], handled, **control, grpc_code="OK") - (
            e2e.sample(before["controller"], handled, **control, grpc_code="OK")
        )
        return now if gateway >= CALLS + 3 and controller >= 1 else None

    after = e2e.wait_for(settled, 10, "every answered call counted")

    def delta(proc: str, metric: str, **labels: str) -> float:
        return e2e.sample(after[proc], metric, **labels) - e2e.sample(
            before[proc], metric, **labels
        )

    # -- gateway: gRPC server metrics with Go-style code names --------------------------------
    assert delta("gateway", handled, **INFER, grpc_code="OK") == CALLS
    assert delta("gateway", handled, **INFER, grpc_code="Unauthenticated") == 2
    assert delta("gateway", handled, **INFER, grpc_code="NotFound") == 1
    codes = {
        s.labels["grpc_code"]
        for s in after["gateway"]["grpc_server_handled"].samples
        if s.name == handled
    }
    assert codes <= {
        "OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
        "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
        "Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
        "Unauthenticated",
    }, codes  # fmt: skip
    assert delta("gateway", "grpc_server_started_total", **INFER) == CALLS + 3
    assert delta("gateway", "grpc_server_handling_seconds_count", **INFER) == CALLS + 3
    latency = _buckets(after["gateway"], "grpc_server_handling_seconds", **INFER)
    assert len(latency) > 3 and "+Inf" in latency, latency

    # -- gateway: domain metrics ----------------------------------------------------------
    assert delta("gateway", "halcyon_gateway_requests_total", outcome="ok") == CALLS
    assert delta("gateway", "halcyon_gateway_requests_total", outcome="unauthenticated") == 2
    assert delta("gateway", "halcyon_gateway_requests_total", outcome="unknown_model") == 1
    sizes = _buckets(after["gateway"], "halcyon_gateway_batch_size")
    assert len(sizes) > 3 and "+Inf" in sizes, sizes
    batches = delta("gateway", "halcyon_gateway_batch_size_count")
    assert 1 <= batches <= CALLS
    assert sizes["+Inf"] == e2e.sample(after["gateway"], "halcyon_gateway_batch_size_count")
    assert e2e.sample(after["gateway"], "halcyon_gateway_fleet_replicas") == len(fleet.workers)
    assert e2e.sample(after["gateway"], "halcyon_gateway_controller_connected") == 1

    # -- workers: every replica that answered counted its batches --------------------------
    assert served_by <= set(fleet.workers)
    ok_batches = 0.0
    for rid in fleet.workers:
        ok = delta(rid, "halcyon_worker_batches_total", outcome="ok")
        assert delta(rid, "halcyon_worker_batches_total", outcome="device_fault") == 0
        if rid in served_by:
            assert ok > 0, rid
            assert e2e.sample(after[rid], "halcyon_worker_batches_total", outcome="ok") > 0
        ok_batches += ok
    # One worker batch per gateway batch, plus any hedge loser that finished before its cancel.
    hedges = delta("gateway", "halcyon_gateway_hedges_total", result="fired")
    assert batches <= ok_batches <= batches + hedges
    worker = after[sorted(served_by)[0]]
    assert _buckets(worker, "halcyon_worker_batch_size")
    assert e2e.sample(worker, "halcyon_worker_controller_connected") == 1

    # -- controller ------------------------------------------------------------------------
    assert delta("controller", handled, **control, grpc_code="OK") == 1
    assert e2e.sample(after["controller"], "halcyon_controller_replicas", version="v1") == len(
        fleet.workers
    )
    assert e2e.sample(after["controller"], "halcyon_controller_fleet_watchers") >= 1

    # -- process metrics everywhere --------------------------------------------------------
    for name, families in after.items():
        assert e2e.sample(families, "process_cpu_seconds_total") > 0, name


def test_outcomes_reach_the_controller(fleet: Any, e2e: SimpleNamespace) -> None:
    """Gateways stream request outcomes to the controller (about once a second)."""
    before = e2e.sample(
        e2e.scrape(fleet.controller), "halcyon_controller_outcomes_total", kind="ok"
    )
    for i in range(5):
        fleet.infer(session_key=f"outcome-{i}")
    e2e.wait_for(
        lambda: (
            e2e.sample(e2e.scrape(fleet.controller), "halcyon_controller_outcomes_total", kind="ok")
            >= before + 5
        ),
        timeout_s=10,
        what="the controller to count the gateway's 5 ok outcomes",
        watch=fleet.procs,
    )
    outcomes = {(o.model, o.metrics.version): o.metrics for o in fleet.get_state().outcomes}
    assert outcomes[(e2e.MODEL, "v1")].requests >= 5
