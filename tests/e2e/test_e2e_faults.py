"""Processes that die, freeze or go away: the fleet heals and the data path keeps serving.

Each test starts its own processes (``launch``) because it breaks them.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from common.errors import parse_rpc_error

pytestmark = pytest.mark.e2e

LEASE_TTL_S = 3.0
# A black hole (fails every batch fast) next to a healthy replica with real device time.
BLACK_HOLE = {"good": (), "bad": ("--fail-rate", "1")}


def _burst(fleet: Any, tag: str, clients: int = 16, calls: int = 3) -> list[tuple[str, str]]:
    """``clients`` threads each sending ``calls`` Infer back to back (2 s deadlines);
    (replica id, "") for an answer, (code name, reason) for a rejection."""

    def client(n: int) -> list[tuple[str, str]]:
        out = []
        for i in range(calls):
            try:
                reply = fleet.infer(session_key=f"{tag}-{n}-{i}", deadline_s=2)
                out.append((reply.replica_id, ""))
            except grpc.RpcError as err:
                rich = parse_rpc_error(err)
                out.append((rich.code.name, f"{rich.reason}: {rich.message}"))
        return out

    with ThreadPoolExecutor(clients) as pool:
        return [r for rs in pool.map(client, range(clients)) for r in rs]


def _until_both_serve(fleet: Any, e2e: SimpleNamespace) -> None:
    """Concurrent bursts until both replicas have answered (sequential calls would all go to
    whichever replica the router learned first)."""
    e2e.wait_for(
        lambda: {rid for rid, _ in _burst(fleet, "both", clients=8, calls=2)} == set(fleet.workers),
        timeout_s=10,
        what="both replicas to serve",
        watch=fleet.live(),
    )


def _faults(fleet: Any, e2e: SimpleNamespace) -> float:
    families = e2e.scrape(fleet.workers["bad"])
    return float(e2e.sample(families, "halcyon_worker_batches_total", outcome="device_fault"))


def test_killed_worker_leaves_the_fleet_and_traffic_moves(
    launch: Any, e2e: SimpleNamespace
) -> None:
    fleet = launch.fleet()
    _until_both_serve(fleet, e2e)

    victim, survivor = fleet.workers["replica-b"], fleet.workers["replica-a"]
    killed_at = time.monotonic()
    assert victim.kill() == -signal.SIGKILL

    # Requests keep succeeding while the controller notices and after: every one of them is
    # answered by the survivor (the dead replica may be tried, but a request never fails).
    replies = []
    while "replica-b" in fleet.replica_ids():
        assert time.monotonic() - killed_at < LEASE_TTL_S + 2.0, "replica-b is still listed"
        replies.append(fleet.infer(deadline_s=2))
        survivor.check_alive()
    left_after = time.monotonic() - killed_at
    assert left_after < LEASE_TTL_S + 2.0

    e2e.wait_for(
        lambda: fleet.gateway_replicas() == 1,
        timeout_s=5,
        what="the gateway to drop replica-b",
        watch=fleet.live(),
    )
    replies += [fleet.infer(session_key=f"after-{i}", deadline_s=2) for i in range(20)]
    assert {r.replica_id for r in replies} == {"replica-a"}
    assert all(r.version == "v1" for r in replies)

    state = fleet.get_state()
    assert [m.replica.replica_id for m in state.replicas] == ["replica-a"]
    metrics = e2e.scrape(fleet.controller)
    assert e2e.sample(metrics, "halcyon_controller_replicas", version="v1") == 1


def test_killed_worker_under_load_loses_no_requests(launch: Any, e2e: SimpleNamespace) -> None:
    # Real device time, so batches are in flight on replica-b when it dies.
    fleet = launch.fleet({"replica-a": (), "replica-b": ()})
    results: list[tuple[float, str, str]] = []  # (started, replica id or code, reason)
    stop = threading.Event()

    def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                reply = fleet.infer(session_key=f"load-{n}-{i}", deadline_s=2)
                results.append((started, reply.replica_id, ""))
            except grpc.RpcError as err:
                rich = parse_rpc_error(err)
                results.append((started, rich.code.name, f"{rich.reason}: {rich.message}"))
            i += 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(16)]
    for t in threads:
        t.start()
    try:
        e2e.wait_for(
            lambda: sum(r[1] == "replica-b" for r in results) >= 20,
            timeout_s=10,
            what="replica-b to serve part of the load",
            watch=fleet.live(),
        )
        fleet.workers["replica-b"].kill()
        e2e.wait_for(
            lambda: fleet.gateway_replicas() == 1,
            timeout_s=LEASE_TTL_S + 2.0,
            what="the gateway to drop replica-b",
            watch=fleet.live(),
        )
        dropped_at = time.monotonic()
        e2e.wait_for(
            lambda: sum(r[0] > dropped_at for r in results) >= 40,
            timeout_s=10,
            what="load to continue on replica-a",
            watch=fleet.live(),
        )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert all(r[1] == "replica-a" for r in results if r[0] > dropped_at)
    failed = Counter((code, why) for _, code, why in results if code not in fleet.workers)
    assert not failed, f"{sum(failed.values())} of {len(results)} calls failed: {failed}"


def test_frozen_worker_expires_by_lease_and_rejoins(launch: Any, e2e: SimpleNamespace) -> None:
    """SIGSTOP keeps the TCP connection open but stops heartbeats: only the lease can tell."""
    ttl = 1.5
    fleet = launch.fleet(controller_args=("--lease-ttl", str(ttl), "--heartbeat-interval", "0.3"))
    frozen = fleet.workers["replica-b"]
    expired = "halcyon_controller_lease_expirations_total"
    expirations = e2e.sample(e2e.scrape(fleet.controller), expired)

    frozen.send(signal.SIGSTOP)
    stopped_at = time.monotonic()
    e2e.wait_for(
        lambda: fleet.replica_ids() == {"replica-a"},
        timeout_s=ttl + 4.0,
        what="the controller to expire replica-b's lease",
        watch=(fleet.controller, fleet.gateway, fleet.workers["replica-a"]),
    )
    assert time.monotonic() - stopped_at >= ttl * 0.5  # the lease lapsed; the stream did not end
    after = e2e.scrape(fleet.controller)
    assert e2e.sample(after, expired) == expirations + 1
    e2e.wait_for(
        lambda: fleet.gateway_replicas() == 1,
        timeout_s=5,
        what="the gateway to drop replica-b",
        watch=(fleet.gateway,),
    )
    replies = [fleet.infer(session_key=f"frozen-{i}", deadline_s=2) for i in range(10)]
    assert {r.replica_id for r in replies} == {"replica-a"}

    # Thawed, the worker finds its lease gone, registers again and serves again.
    frozen.send(signal.SIGCONT)
    fleet.wait_converged(timeout_s=10)
    _until_both_serve(fleet, e2e)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_gateway_keeps_serving_without_the_controller(
    launch: Any, e2e: SimpleNamespace, sig: signal.Signals
) -> None:
    ttl = 1.0
    lease = ("--lease-ttl", str(ttl), "--heartbeat-interval", "0.3")
    fleet = launch.fleet(
        {"replica-a": (), "replica-b": ()},  # real device time (see test_e2e_batching.py)
        controller_args=(*lease, "--shutdown-grace", "1"),
    )
    for i in range(4):
        fleet.infer(session_key=f"before-{i}")

    fleet.controller.send(sig)
    code = fleet.controller.wait_exit(10)
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), fleet.controller.describe()
    gone_at = time.monotonic()
    e2e.wait_for(
        lambda: e2e.sample(e2e.scrape(fleet.gateway), "halcyon_gateway_controller_connected") == 0,
        timeout_s=5,
        what="the gateway to notice the controller is gone",
        watch=fleet.live(),
    )

    # Serve on the last fleet seen, for longer than any lease the controller handed out.
    served: set[str] = set()
    calls = 0
    while calls < 20 or time.monotonic() - gone_at < 2 * ttl:
        reply = fleet.infer(session_key=f"after-{calls}", deadline_s=2)
        assert reply.version == "v1"
        served.add(reply.replica_id)
        calls += 1
    assert served <= set(fleet.workers)
    assert fleet.health(fleet.gateway) == health_pb2.HealthCheckResponse.SERVING
    metrics = e2e.scrape(fleet.gateway)
    assert e2e.sample(metrics, "halcyon_gateway_fleet_replicas") == 2
    for proc in (fleet.gateway, *fleet.workers.values()):
        proc.check_alive()


# -- a black-hole replica --------------------------------------------------------------------


def test_black_hole_replica_fails_no_request_and_is_starved(
    launch: Any, e2e: SimpleNamespace
) -> None:
    fleet = launch.fleet(BLACK_HOLE)
    # A second gateway (another routing seed, its own breakers): two independent first contacts.
    second = launch.gateway(fleet.controller, "--seed", "7", name="gateway-2")
    second.wait_ready()
    other = launch.attach(fleet, second)

    # First contact: concurrency keeps "good" (one slot) busy, so the black hole is tried and
    # fails fast; every request whose batch failed there is retried on "good" in time.
    first = _burst(fleet, "first") + _burst(other, "first-2")
    assert _faults(fleet, e2e) >= 1, "the failing replica was never tried"
    assert Counter(rid for rid, _ in first) == {"good": len(first)}, Counter(first)

    # Its breaker is open now: the same load again is served entirely by "good", and the black
    # hole sees at most a half-open probe or two.
    faults = _faults(fleet, e2e)
    again = _burst(fleet, "again")
    assert Counter(rid for rid, _ in again) == {"good": len(again)}, Counter(again)
    assert _faults(fleet, e2e) - faults <= 2

    failures = sum(
        e2e.sample(e2e.scrape(gw), "halcyon_gateway_batch_failures_total")
        for gw in (fleet.gateway, second)
    )
    assert failures == _faults(fleet, e2e)
