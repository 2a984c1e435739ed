"""A device whose every batch takes 30 s (a long generation on a real model) is served on the
first try, with its warm-up and without (the e2e suite covers 1 ms to 5 s; this one costs
about two minutes: a 60 s warm-up, then 30 s batches)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from reliability_fleet import sample, scrape

from common.cost_samples import CostSampleValue
from common.durations import to_seconds
from common.errors import parse_rpc_error

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

BATCH_S = 30.0
DEVICE = ("--intercept-ms", "30000", "--ms-per-token", "0", "--jitter", "0")


def test_a_30_s_device_is_served_on_the_first_try(launcher: Any) -> None:
    fleet = launcher.fleet(
        {
            "r-30s": (*DEVICE, "--model", "dev-30s"),
            "r-30s-cold": (*DEVICE, "--model", "dev-30s-cold", "--no-warm-up"),
        },
        converge_timeout_s=150.0,  # two 30 s warm-up batches before it registers
    )
    state = {m.replica.replica_id: m.replica for m in fleet.get_state().replicas}
    warm = [CostSampleValue.from_proto(s) for s in state["r-30s"].warmup]
    assert [s.seconds for s in warm] == pytest.approx([BATCH_S, BATCH_S], rel=0.05)
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

    jobs = [(m, i) for m in ("dev-30s", "dev-30s-cold") for i in range(3)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(one, jobs))
    assert all(execution >= 0 for _, execution in results), results
    assert all(e == pytest.approx(BATCH_S, rel=0.1) for _, e in results), results
    assert sample(scrape(fleet.gateway), "halcyon_gateway_batch_failures_total") == 0
