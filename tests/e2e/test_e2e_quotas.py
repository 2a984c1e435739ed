"""Fleet-wide quotas live (issue #22, ADR 0003): two gateways share one tenant's contract.

A controller, two instant workers and two gateways started with ``--expected-gateways 2``,
one tenant with a quota, clients on both gateways offering more than the whole contract each.
Once the controller's leases are in force the fleet admits the contract (within 15 %: a live
test on a shared machine; the 5 % figure is the bench's), not twice it; with one gateway
killed the other is granted the whole contract within a few seconds.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from pathlib import Path

import grpc
import pytest

from gateway.validation import count_input_tokens
from halcyon.v1 import infer_pb2, infer_pb2_grpc
from tests.support.e2e import INSTANT, MODEL, Fleet, Launcher, sample, scrape, wait_for

pytestmark = pytest.mark.e2e

KEY = "e2e-key-metered"
RATE = 3000.0  # work tokens per second, fleet-wide
PROMPT = "hello from the quota test"
OUTPUT_TOKENS = 100
COST = count_input_tokens(PROMPT) + OUTPUT_TOKENS
OFFER_PER_GATEWAY = 1.3  # times the whole contract, at each gateway


def _tenants(path: Path) -> Path:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    path.write_text(
        "tenants:\n"
        f"  - name: metered\n    rate: {RATE}\n    burst: {RATE}\n"
        f"    key_sha256: [{digest}]\n"
    )
    return path


class _Clients:
    """Paced client threads on one gateway; admitted requests' times kept."""

    def __init__(self, address: str, rate_per_s: float, threads: int = 4) -> None:
        self.admitted: list[float] = []
        self.refused = 0
        self._stop = threading.Event()
        self._channel = grpc.insecure_channel(address)
        self._stub = infer_pb2_grpc.InferServiceStub(self._channel)
        gap = threads / rate_per_s
        self._threads = [
            threading.Thread(target=self._run, args=(gap, i * gap / threads), daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, gap: float, offset: float) -> None:
        request = infer_pb2.InferRequest(model=MODEL, input=PROMPT, max_output_tokens=OUTPUT_TOKENS)
        due = time.monotonic() + offset
        while not self._stop.is_set():
            due += gap
            try:
                self._stub.Infer(request, metadata=(("x-api-key", KEY),), timeout=2.0)
                self.admitted.append(time.monotonic())
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    self.refused += 1
            self._stop.wait(max(0.0, due - time.monotonic()))

    def admitted_between(self, start: float, end: float) -> int:
        return sum(1 for t in list(self.admitted) if start <= t < end)

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._channel.close()


def _admitted_rate(clients: list[_Clients], seconds: float) -> float:
    start = time.monotonic()
    time.sleep(seconds)
    end = time.monotonic()
    return sum(c.admitted_between(start, end) for c in clients) * COST / (end - start)


def _on_lease(fleet: Fleet) -> bool | None:
    families = scrape(fleet.gateway)
    share = sample(families, "halcyon_gateway_quota_share_per_second",
                   tenant="metered", source="lease")  # fmt: skip
    return True if share > 0 else None


def test_two_gateways_admit_one_contract_and_one_takes_it_all_alone(
    launch: Launcher, tmp_path: Path
) -> None:
    tenants = str(_tenants(tmp_path / "tenants.yaml"))
    flags = ("--tenants", tenants, "--expected-gateways", "2")
    first = launch.fleet({"replica-a": INSTANT, "replica-b": INSTANT}, gateway_args=flags)
    second_proc = launch.gateway(first.controller, *flags, name="gateway-2")
    second_proc.wait_ready()
    second = launch.attach(first, second_proc)
    offer = OFFER_PER_GATEWAY * RATE / COST
    clients = [_Clients(first.gateway.grpc, offer), _Clients(second.gateway.grpc, offer)]
    try:
        for fleet in (first, second):
            wait_for(functools.partial(_on_lease, fleet), 15.0, f"{fleet.gateway.name} on a lease")
        time.sleep(2.0)  # the buckets settle from their initial share onto the lease
        both = _admitted_rate(clients, 8.0)
        assert both == pytest.approx(RATE, rel=0.15), f"admitted {both:.0f}/s of {RATE:.0f}/s"

        second.gateway.kill()
        clients[1].stop()
        time.sleep(4.0)  # the stream ends, the next grant gives the survivor everything
        alone = _admitted_rate(clients[:1], 5.0)
        print(f"quotas: two gateways {both:.0f}/s, one alone {alone:.0f}/s of {RATE:.0f}/s")
        assert alone == pytest.approx(RATE, rel=0.15), f"alone {alone:.0f}/s of {RATE:.0f}/s"
    finally:
        for c in clients:
            c.stop()
