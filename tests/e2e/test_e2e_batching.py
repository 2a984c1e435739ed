"""The batcher in a real fleet: traffic shapes the e2e suite found it mishandling.

Both tests are strict xfails pinned to product bugs (see their reasons); they start passing
(and then fail as XPASS) when the bug is fixed, which is the cue to drop the marker.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from common.errors import parse_rpc_error

pytestmark = pytest.mark.e2e


def test_zero_cost_fleet_serves_a_mix_of_deadlines(launch: Any, e2e: SimpleNamespace) -> None:
    fleet = launch.fleet()  # --intercept-ms 0 --ms-per-token 0
    # 5 s and 2 s deadlines: two deadline classes for the batcher's horizon choice, which it
    # first makes after 32 arrivals.
    for i in range(80):
        deadline = 5.0 if i % 4 == 0 else 2.0
        try:
            fleet.infer(session_key=f"mix-{i}", deadline_s=deadline)
        except grpc.RpcError as err:
            raise AssertionError(f"call {i} failed: {parse_rpc_error(err)}") from None
    assert not fleet.gateway.errors()


def test_open_breaker_replica_is_not_planned_as_capacity(launch: Any, e2e: SimpleNamespace) -> None:
    fleet = launch.fleet({"good": (), "bad": ("--fail-rate", "1")})

    def burst(tag: str, clients: int = 16, calls: int = 3) -> None:
        def client(n: int) -> None:
            for i in range(calls):
                fleet.infer(session_key=f"{tag}-{n}-{i}", deadline_s=2)

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))

    burst("trip")  # the black hole fails its first batches and its breaker opens
    bad = e2e.scrape(fleet.workers["bad"])
    assert e2e.sample(bad, "halcyon_worker_batches_total", outcome="device_fault") >= 1

    before = e2e.scrape(fleet.gateway)
    burst("measure")
    after = e2e.scrape(fleet.gateway)
    size = "halcyon_gateway_batch_size"
    items = e2e.sample(after, f"{size}_sum") - e2e.sample(before, f"{size}_sum")
    batches = e2e.sample(after, f"{size}_count") - e2e.sample(before, f"{size}_count")
    # Sixteen clients against one effective replica batch ~8 requests at a time (a fleet of
    # just "good" does); with the black hole starved nothing should change.
    assert items / batches >= 3.0, f"{items:.0f} requests in {batches:.0f} batches"
