"""Every rejection of the Infer path as the client sees it: code, ErrorInfo reason, details."""

from __future__ import annotations

import hashlib
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from common.errors import parse_rpc_error
from gateway.admission import TenantRegistry
from halcyon.v1 import control_pb2, fleet_pb2
from worker.metrics import BatchOutcome

MODEL = "llama-3-8b"
TINY_KEY = "tiny-tenant-key"


async def test_missing_key_is_unauthenticated(start_worker: Any, start_gateway: Any) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker()])
    err = await gw.infer_error(key=None)
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.reason == "MISSING_CREDENTIALS"
    assert gw.sample("halcyon_gateway_requests_total", {"outcome": "unauthenticated"}) == 1


@pytest.mark.parametrize("scheme", ["x-api-key", "authorization"])
async def test_wrong_key_is_unauthenticated(
    start_worker: Any, start_gateway: Any, scheme: str
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker()])
    value = "not-a-key" if scheme == "x-api-key" else "Bearer not-a-key"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.stub.Infer(gw.request(), metadata=((scheme, value),), timeout=5.0)
    err = parse_rpc_error(info.value)
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.reason == "INVALID_CREDENTIALS"


@pytest.mark.parametrize(
    ("fields", "bad_field"),
    [
        ({"text": ""}, "input"),
        ({"max_output_tokens": 5000}, "max_output_tokens"),
        ({"model": ""}, "model"),
        ({"session_key": "k" * 300}, "session_key"),
        ({"timeout": duration_pb2.Duration(seconds=-1)}, "timeout"),
    ],
)
async def test_malformed_field_is_named_in_bad_request(
    start_worker: Any, start_gateway: Any, fields: dict[str, Any], bad_field: str
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker()])
    err = await gw.infer_error(**fields)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in err.field_violations] == [bad_field]
    assert err.field_violations[0].description


async def test_unknown_model_is_not_found(start_worker: Any, start_gateway: Any) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker()])
    err = await gw.infer_error(model="no-such-model")
    assert err.code == grpc.StatusCode.NOT_FOUND
    assert err.reason == "UNKNOWN_MODEL"
    assert gw.sample("halcyon_gateway_requests_total", {"outcome": "unknown_model"}) == 1


async def test_version_without_replicas_is_no_capacity_with_retry(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    # The controller routes everyone to v2, but only a v1 replica is up.
    gw.apply([await start_worker(version="v1")], routing={MODEL: ("v2", "", 0)})
    err = await gw.infer_error()
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.reason == "NO_CAPACITY"
    assert err.retry_after_s is not None and err.retry_after_s > 0
    assert gw.sample("halcyon_gateway_shed_total", {"reason": "no_capacity"}) == 1


async def test_version_whose_replicas_all_left_is_no_capacity_with_retry(
    start_worker: Any, start_gateway: Any
) -> None:
    worker = await start_worker(version="v1")
    gw = await start_gateway()
    gw.apply([worker])
    assert (await gw.infer()).output
    # The replica leaves the fleet; the routing entry stays.
    gw.apply([], routing={MODEL: ("v1", "", 0)})
    err = await gw.infer_error()
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.reason == "NO_CAPACITY"
    assert err.retry_after_s is not None and err.retry_after_s > 0


async def test_no_snapshot_yet_is_no_capacity_with_retry(start_gateway: Any) -> None:
    gw = await start_gateway()
    err = await gw.infer_error()
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.reason == "NO_CAPACITY"
    assert err.retry_after_s is not None and err.retry_after_s > 0


async def test_model_without_routing_entry_is_no_capacity_with_retry(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker()], routing={})
    err = await gw.infer_error()
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.reason == "NO_CAPACITY"
    assert err.retry_after_s is not None and err.retry_after_s > 0


def _tiny_tenants() -> TenantRegistry:
    return TenantRegistry.from_mapping(
        {
            "tenants": [
                {
                    "name": "tiny",
                    "priority": "standard",
                    "rate": 1,  # work tokens per second
                    "burst": 40,
                    "key_sha256": [hashlib.sha256(TINY_KEY.encode()).hexdigest()],
                }
            ]
        }
    )


async def test_quota_exhausted_is_resource_exhausted_with_computed_retry(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway(tenants=_tiny_tenants())
    gw.apply([await start_worker()])
    # 20 bytes -> 5 prompt tokens, + 20 output tokens = 25 work tokens of a 40-token burst.
    first = await gw.infer(key=TINY_KEY, text="a" * 20, max_output_tokens=20)
    assert first.output

    err = await gw.infer_error(key=TINY_KEY, text="a" * 20, max_output_tokens=20)

    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.reason == "QUOTA_EXCEEDED"
    assert [v.subject for v in err.quota_violations] == ["tenant:tiny"]
    assert err.quota_violations[0].description
    # 15 tokens left (plus what refilled meanwhile), 25 needed, refilling at 1/s: about ten
    # seconds, computed from the bucket, not a constant.
    assert err.retry_after_s is not None
    assert 8.0 < err.retry_after_s <= 10.0 + 1e-3, err.retry_after_s
    assert gw.sample("halcyon_gateway_requests_total", {"outcome": "quota_exceeded"}) == 1

    # The same advice as a trailer, for clients that read no rich details.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.infer(key=TINY_KEY, text="a" * 20, max_output_tokens=20)
    trailers = dict(info.value.trailing_metadata() or ())
    assert 8_000 < int(trailers["grpc-retry-pushback-ms"]) <= 10_000

    # A smaller request still fits the 15 tokens that are left: quota is per work token.
    assert (await gw.infer(key=TINY_KEY, text="a" * 4, max_output_tokens=8)).output


async def test_one_millisecond_timeout_on_a_slow_worker_is_rejected_up_front(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    worker = await start_worker(intercept_ms=150.0)
    gw.apply([worker])
    err = await gw.infer_error(timeout=duration_pb2.Duration(nanos=1_000_000))
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.reason in ("DEADLINE_UNREACHABLE", "DEADLINE_MISSED")
    # Rejected before any device time was spent.
    assert worker.metrics.batches[BatchOutcome("ok")]._value.get() == 0


async def test_learned_slowness_makes_a_tight_deadline_unreachable(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    worker = await start_worker(intercept_ms=150.0)
    gw.apply([worker])
    for _ in range(3):  # let the cost model learn the replica's ~150 ms
        assert (await gw.infer()).output
    served = worker.metrics.batches[BatchOutcome("ok")]._value.get()

    err = await gw.infer_error(timeout=duration_pb2.Duration(nanos=60_000_000))

    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.reason == "DEADLINE_UNREACHABLE"
    assert worker.metrics.batches[BatchOutcome("ok")]._value.get() == served
    assert gw.sample("halcyon_gateway_shed_total", {"reason": "deadline_unreachable"}) == 1


async def test_grpc_deadline_is_the_request_deadline(start_worker: Any, start_gateway: Any) -> None:
    # No timeout field: the client's own gRPC deadline (60 ms) is judged against the learned
    # ~150 ms batch time, and the gateway answers with its reason before the deadline passes.
    gw = await start_gateway()
    worker = await start_worker(intercept_ms=150.0)
    gw.apply([worker])
    for _ in range(3):
        assert (await gw.infer()).output
    err = await gw.infer_error(deadline_s=0.06)
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.reason == "DEADLINE_UNREACHABLE"


async def test_replica_of_another_model_does_not_make_the_model_known(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    other = control_pb2.FleetMember(
        replica=fleet_pb2.ReplicaDescriptor(
            replica_id="other-1",
            address="127.0.0.1:1",
            model="mistral-7b",
            version="v1",
            slots=1,
            speed=1.0,
        )
    )
    gw.apply([await start_worker()], replicas=[other])
    err = await gw.infer_error(model="gpt-unknown")
    assert err.code == grpc.StatusCode.NOT_FOUND
    assert err.reason == "UNKNOWN_MODEL"
