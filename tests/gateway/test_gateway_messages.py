"""Rejection messages a user can act on: DEADLINE_UNREACHABLE says the deadline, the prediction
and its parts (and when nothing was queued); QUOTA_EXCEEDED says the balance and when it will
suffice. Through a real gateway and worker where the numbers come from them, and directly for
the wording of each shape."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from gateway.admission import TenantRegistry
from gateway.admission.quota import QuotaExceeded
from gateway.batching import PredictionParts
from gateway.rejections import unreachable_error

KEY = "message-tenant-key"


def _ms(text: str, label: str) -> float:
    match = re.search(rf"([0-9.]+) ms {label}", text)
    assert match, f"no '<n> ms {label}' in {text!r}"
    return float(match.group(1))


async def test_unreachable_on_an_idle_gateway_says_nothing_was_queued(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker(intercept_ms=150.0)])
    for _ in range(3):  # let the cost model learn the replica's ~150 ms
        assert (await gw.infer()).output
    err = await gw.infer_error(timeout=duration_pb2.Duration(nanos=60_000_000))
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED and err.reason == "DEADLINE_UNREACHABLE"
    text = err.message
    assert "nothing queued and no replica busy" in text, text
    left = float(re.search(r"([0-9.]+) ms were left", text).group(1))  # type: ignore[union-attr]
    assert 0 < left <= 60.0
    predicted = float(re.search(r"take ([0-9.]+) ms", text).group(1))  # type: ignore[union-attr]
    assert predicted > left
    assert "retrying unchanged cannot help" in text
    # The same figures, machine-readable.
    meta = err.metadata
    assert float(meta["deadline_ms"]) == pytest.approx(left, abs=0.06)
    assert float(meta["predicted_completion_ms"]) == pytest.approx(predicted, abs=0.06)
    assert float(meta["own_ms"]) + float(meta["margin_ms"]) == pytest.approx(predicted, abs=0.1)
    assert float(meta["on_device_ms"]) == float(meta["queued_ahead_ms"]) == 0.0


def test_unreachable_behind_busy_work_names_every_part() -> None:
    parts = PredictionParts(
        deadline_in=0.060,
        on_device=0.040,
        queued_ahead=0.080,
        sharing_batch=0.010,
        own=0.020,
        margin=0.0023,
        queued_requests=12,
        batch_mates=3,
    )
    err = unreachable_error(parts, parts.total)
    text = err.message
    assert "60.0 ms were left" in text and "predicted to finish in 152.3 ms" in text
    assert _ms(text, "until the replica finishes the batch on its device") == 40.0
    assert _ms(text, r"for the batches queued ahead of it \(12 requests waiting in all\)") == 80.0
    assert _ms(text, "for the 3 requests ahead of it in its batch") == 10.0
    assert _ms(text, "of its own work") == 20.0
    assert _ms(text, "safety margin") == 2.3
    # An earlier deadline goes first: requests waiting, none of them ahead of it.
    first = PredictionParts(deadline_in=0.01, on_device=0.03, own=0.005, queued_requests=6)
    assert "nothing queued ahead of it on that replica (6 requests waiting in all)" in (
        unreachable_error(first, first.total).message
    )
    assert err.metadata["deadline_ms"] == "60.000"
    assert err.metadata["predicted_completion_ms"] == "152.300"
    assert err.metadata["queued_ahead_ms"] == "80.000"


def test_unreachable_with_a_busy_device_and_an_empty_queue_says_nothing_queued() -> None:
    parts = PredictionParts(deadline_in=0.010, on_device=0.030, own=0.005)
    text = unreachable_error(parts, parts.total).message
    assert "30.0 ms until the replica finishes the batch on its device, nothing queued" in text
    assert "no one ahead of it in its batch" in text


def test_unreachable_after_the_deadline_passed() -> None:
    err = unreachable_error(PredictionParts(deadline_in=-0.004), 0.0)
    assert "had already passed when the request arrived (4.0 ms ago)" in err.message
    assert err.metadata["deadline_ms"] == "-4.000"


def _tenants(rate: float, burst: float) -> TenantRegistry:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return TenantRegistry.from_mapping(
        {"tenants": [{"name": "tiny", "priority": "standard", "rate": rate, "burst": burst,
                      "key_sha256": [digest]}]}
    )  # fmt: skip


async def test_quota_exceeded_says_the_balance_and_when_it_will_suffice(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway(tenants=_tenants(rate=1, burst=40))
    gw.apply([await start_worker()])
    # 20 bytes -> 5 prompt tokens + 20 output tokens = 25 work tokens of a 40-token burst.
    assert (await gw.infer(key=KEY, text="a" * 20, max_output_tokens=20)).output
    err = await gw.infer_error(key=KEY, text="a" * 20, max_output_tokens=20)
    assert err.reason == "QUOTA_EXCEEDED"
    text = err.message
    assert "request needs 25 work tokens, the tenant has 15 left (quota 1/s, burst 40)" in text
    enough = re.search(r"enough in ([0-9.]+) s, retry then", text)
    assert enough, text
    assert err.retry_after_s is not None
    assert float(enough.group(1)) == pytest.approx(err.retry_after_s, abs=0.01)
    assert err.quota_violations[0].description in text


def test_quota_description_for_large_requests_and_a_bucket_that_never_refills() -> None:
    big = QuotaExceeded("t", 500.0, 0.25, rate=1000.0, burst=400.0, balance=150.0)
    assert big.description == (
        "request needs 500 work tokens (more than the burst: it waits for a full bucket of 400)"
        ", the tenant has 150 left (quota 1000/s, burst 400); enough in 250.0 ms, retry then"
    )
    never = QuotaExceeded("t", 50.0, float("inf"), rate=0.0, burst=400.0, balance=10.0)
    assert never.description.endswith("the quota never refills: raise it")
