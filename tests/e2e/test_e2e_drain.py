"""An operator drain and the way back, with real processes and the real grpcurl.

Drain replica-a through the controller: the answer says what to do next, the gateway sends it
nothing while the worker stays up and registered as draining; undrain it: traffic reaches it
again. Nothing is restarted in between.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

pytestmark = pytest.mark.e2e

CONTROL = "halcyon.v1.ControlService"


def _operator(e2e: SimpleNamespace, fleet: Any, method: str, replica_id: str) -> dict[str, Any]:
    out = e2e.grpcurl(
        "-H", f"authorization: Bearer {e2e.OPERATOR_TOKEN}",
        "-d", json.dumps({"replica_id": replica_id}),
        fleet.controller.grpc, f"{CONTROL}/{method}",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    answer: dict[str, Any] = json.loads(out.stdout)
    return answer


def _burst(fleet: Any, clients: int = 8, calls: int = 4) -> list[str]:
    """Replica ids that answered ``clients`` concurrent callers (concurrency spreads the
    load, so an idle replica that can take work gets some)."""

    def client(n: int) -> list[str]:
        out = []
        for i in range(calls):
            try:
                out.append(fleet.infer(session_key=f"c{n}-{i}", deadline_s=5).replica_id)
            except grpc.RpcError as err:
                out.append(f"error {err.code().name}")
        return out

    with ThreadPoolExecutor(clients) as pool:
        return [r for rs in pool.map(client, range(clients)) for r in rs]


def _draining(fleet: Any) -> dict[str, bool]:
    return {m.replica.replica_id: m.load.draining for m in fleet.get_state().replicas}


def _batches(e2e: SimpleNamespace, worker: Any) -> float:
    return float(e2e.sample(e2e.scrape(worker), "halcyon_worker_batches_total", outcome="ok"))


def test_drain_then_undrain_brings_a_replica_back_without_a_restart(
    launch: Any, e2e: SimpleNamespace
) -> None:
    fleet = launch.fleet()
    a = fleet.workers["replica-a"]
    e2e.wait_for(
        lambda: set(_burst(fleet)) == {"replica-a", "replica-b"}, 15, "both replicas to serve",
        watch=fleet.live(),
    )  # fmt: skip

    drained = _operator(e2e, fleet, "DrainReplica", "replica-a")
    assert drained["replica"]["load"]["draining"] is True
    assert "UndrainReplica" in drained["next_steps"]
    # The worker drains and stays registered, reporting it: nothing to restart.
    e2e.wait_for(
        lambda: _draining(fleet) == {"replica-a": True, "replica-b": False}
        and e2e.sample(e2e.scrape(a), "halcyon_worker_draining") == 1,
        10, "replica-a drained and still registered", watch=fleet.live(),
    )  # fmt: skip
    before = _batches(e2e, a)
    answers = _burst(fleet)
    assert set(answers) == {"replica-b"}, answers
    assert _batches(e2e, a) == before  # not one batch reached it
    a.check_alive()

    undrained = _operator(e2e, fleet, "UndrainReplica", "replica-a")
    assert undrained["was_draining"] is True
    e2e.wait_for(
        lambda: _draining(fleet) == {"replica-a": False, "replica-b": False}, 10,
        "replica-a to report it takes work", watch=fleet.live(),
    )  # fmt: skip
    e2e.wait_for(
        lambda: "replica-a" in _burst(fleet), 15, "traffic to reach replica-a again",
        watch=fleet.live(),
    )  # fmt: skip
    assert _batches(e2e, a) > before
    assert e2e.sample(e2e.scrape(a), "halcyon_worker_draining") == 0


def test_undrain_of_an_unknown_replica_says_where_to_look(
    launch: Any, e2e: SimpleNamespace
) -> None:
    fleet = launch.fleet({"replica-a": e2e.INSTANT})
    out = e2e.grpcurl(
        "-H", f"authorization: Bearer {e2e.OPERATOR_TOKEN}", "-d", '{"replica_id": "ghost"}',
        fleet.controller.grpc, f"{CONTROL}/UndrainReplica",
    )  # fmt: skip
    assert out.returncode != 0
    assert "NotFound" in out.stderr and "GetState lists" in out.stderr
