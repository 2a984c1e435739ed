"""A device whose every batch takes 30 s (a long generation on a real model) is served on the
first try. The e2e suite covers 1 ms to 5 s with a warm-up and without; this one runs the
case the warm-up does not cover — a 30 s device that registered without one, whose first
batch no constant may time out — in about 35 s (with a warm-up it would cost a minute more
before registering: two 30 s batches)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from reliability_fleet import sample, scrape

from common.durations import to_seconds
from common.errors import parse_rpc_error

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

BATCH_S = 30.0
DEVICE = ("--intercept-ms", "30000", "--ms-per-token", "0", "--jitter", "0")


def test_a_30_s_device_is_served_on_the_first_try(launcher: Any) -> None:
    fleet = launcher.fleet({"r-30s-cold": (*DEVICE, "--model", "dev-30s-cold", "--no-warm-up")})
    state = {m.replica.replica_id: m.replica for m in fleet.get_state().replicas}
    assert len(state["r-30s-cold"].warmup) == 0

    def one(job: tuple[str, int]) -> tuple[str, float]:
        model, i = job
        try:
            reply = fleet.infer(
                model=model, session_key=f"{model}-{i}", deadline_s=200.0, max_output_tokens=8
            )
        except grpc.RpcError as err:
            rich = parse_rpc_error(err)
            return f"{model}: {rich.code.name}/{rich.reason}: {rich.message}", -1.0
        return model, to_seconds(reply.timings.execution)

    jobs = [("dev-30s-cold", 0)]  # one batch: its first answer is what no constant may cut
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(one, jobs))
    assert all(execution >= 0 for _, execution in results), results
    assert all(e == pytest.approx(BATCH_S, rel=0.1) for _, e in results), results
    assert sample(scrape(fleet.gateway), "halcyon_gateway_batch_failures_total") == 0
