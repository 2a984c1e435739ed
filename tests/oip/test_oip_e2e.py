"""A fleet with a KServe-backed replica, under load, through the death and return of its backend.

Controller + gateway + two replicas: ``replica-oip`` (``--runtime oip`` in front of a real KServe
model server) and ``replica-sim`` (the simulated device). Client threads send Infer for 10 s;
4 s in, the KServe server is killed (SIGKILL: no goodbye on its connections). Then:

* no request is lost — every one got OK or a typed Halcyon error (ErrorInfo in the
  ``halcyon.dev`` domain), the definition the reliability suite uses;
* ``replica-oip`` turns NOT_SERVING and leaves the controller's fleet (GetState);
* the rest of the fleet serves: requests keep succeeding after the kill;
* when the backend is started again, ``replica-oip`` is SERVING, registered, and serves again.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from common.errors import DOMAIN, parse_rpc_error
from tests.support import e2e
from tests.support.oip import BACKEND_MODEL, Backends

pytestmark = pytest.mark.e2e

LOAD_S = 10.0
KILL_AT_S = 4.0
CLIENTS = 4
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _outcome(fleet: Any, n: int) -> tuple[str, str | None]:
    """One Infer: ``("OK", replica)``, ``("CODE/REASON", None)`` for a Halcyon status, or the
    bare ``("CODE", None)`` for anything else — a lost request."""
    try:
        reply = fleet.infer(
            input=f"request {n} from the oip e2e test", max_output_tokens=16, deadline_s=5.0
        )
    except grpc.RpcError as err:
        rich = parse_rpc_error(err)
        if rich.reason is not None and rich.domain == DOMAIN:
            return f"{rich.code.name}/{rich.reason}", None
        return rich.code.name, None
    return "OK", str(reply.replica_id)


def test_killing_the_kserve_backend_loses_nothing_and_the_replica_rejoins(
    launch: Any, backends: Backends
) -> None:
    backend = backends.start(name="kserve")
    fleet = launch.fleet(
        {
            "replica-oip": (
                "--runtime", "oip", "--backend", backend.address,
                "--backend-model", BACKEND_MODEL, "--slots", "2",
            ),
            "replica-sim": ("--slots", "2"),
        }
    )  # fmt: skip
    oip = fleet.workers["replica-oip"]
    assert fleet.health(oip) == SERVING

    start = time.monotonic()
    lock = threading.Lock()
    outcomes: Counter[str] = Counter()
    served_by: Counter[tuple[str, bool]] = Counter()  # (replica, after the kill)
    ok_after_kill = 0
    killed_at: list[float] = []
    counter = iter(range(1_000_000))

    def client() -> None:
        nonlocal ok_after_kill
        while time.monotonic() - start < LOAD_S:
            with lock:
                n = next(counter)
            key, replica = _outcome(fleet, n)
            with lock:
                outcomes[key] += 1
                after = bool(killed_at)
                if replica is not None:
                    served_by[replica, after] += 1
                    ok_after_kill += after

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(KILL_AT_S)
    with lock:
        before_kill = sum(n for (rid, after), n in served_by.items() if rid == "replica-oip")
    backend.kill()
    with lock:
        killed_at.append(time.monotonic() - start)

    # While the load goes on: the oip replica turns NOT_SERVING and leaves the fleet.
    e2e.wait_for(lambda: fleet.health(oip) == NOT_SERVING, 10, "replica-oip readiness NOT_SERVING")
    e2e.wait_for(
        lambda: fleet.replica_ids() == {"replica-sim"},
        10,
        "replica-oip to leave the controller's fleet",
        watch=fleet.live(),
    )
    left_at = time.monotonic() - start
    for t in threads:
        t.join(LOAD_S + 10)
    assert not any(t.is_alive() for t in threads)

    lost = {k: n for k, n in outcomes.items() if k != "OK" and "/" not in k}
    summary = f"outcomes {dict(outcomes)}, served by {dict(served_by)}, left at {left_at:.1f} s"
    print(summary)
    assert not lost, f"lost requests: {lost}; {summary}"
    assert before_kill > 0, f"replica-oip served nothing before the kill; {summary}"
    assert ok_after_kill > 0 and served_by["replica-sim", True] > 0, summary
    assert left_at < LOAD_S, summary  # it left while the load still ran
    assert outcomes["OK"] >= 0.95 * sum(outcomes.values()), summary

    # The backend comes back: so does the replica, and it serves again.
    backend.start().wait_ready()
    e2e.wait_for(lambda: fleet.health(oip) == SERVING, 15, "replica-oip SERVING again")
    e2e.wait_for(
        lambda: fleet.replica_ids() == {"replica-oip", "replica-sim"},
        15,
        "replica-oip to rejoin the controller's fleet",
        watch=fleet.live(),
    )
    e2e.wait_for(lambda: fleet.gateway_replicas() == 2, 15, "the gateway to see replica-oip again")

    def served_by_oip() -> bool:
        # Concurrent, not serial: one request at a time always finds the idle simulated replica
        # faster (the router is right to prefer it), so only load shows the rejoined replica
        # taking its share again.
        with ThreadPoolExecutor(max_workers=8) as pool:
            replicas = list(pool.map(lambda n: _outcome(fleet, n)[1], range(16)))
        return "replica-oip" in replicas

    e2e.wait_for(served_by_oip, 15, "a request served by replica-oip again")
    assert oip.alive and oip.log_file.read_text().count("model runtime ready again") == 1
