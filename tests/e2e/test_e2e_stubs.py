"""The generated stubs against a running fleet: answers, typed rejections, operator RPCs.

Every rejection is read back with ``common.errors.parse_rpc_error`` from the
``grpc-status-details-bin`` trailer the real server sent.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from halcyon.v1 import infer_pb2

pytestmark = pytest.mark.e2e

DOMAIN = "halcyon.dev"


def test_infer_ok(fleet: Any, e2e: SimpleNamespace) -> None:
    reply = fleet.infer(max_output_tokens=32, session_key="user-1", deadline_s=5)
    assert reply.output.strip()
    assert reply.model == e2e.MODEL
    assert reply.version == "v1"
    assert reply.replica_id in fleet.workers
    assert reply.request_id
    assert not reply.hedged
    assert reply.batch.size >= 1
    assert reply.batch.flush_reason != infer_pb2.FLUSH_REASON_UNSPECIFIED
    assert reply.batch.tokens >= reply.usage.input_tokens + 32
    total = reply.timings.total.ToNanoseconds()
    assert 0 < total < 5e9
    assert reply.timings.queued.ToNanoseconds() <= total
    assert 1 <= reply.usage.output_tokens <= 32
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens


def test_infer_accepts_the_key_as_a_bearer_token(fleet: Any, e2e: SimpleNamespace) -> None:
    reply = fleet.infer_stub.Infer(
        infer_pb2.InferRequest(model=e2e.MODEL, input="hi"),
        metadata=(("authorization", f"Bearer {e2e.API_KEY}"),),
        timeout=5,
    )
    assert reply.version == "v1"


def test_unknown_model_is_not_found(fleet: Any, e2e: SimpleNamespace) -> None:
    err = e2e.rich_error(lambda: fleet.infer(model="no-such-model"))
    assert err.code == grpc.StatusCode.NOT_FOUND, err
    assert err.reason == "UNKNOWN_MODEL"
    assert err.domain == DOMAIN
    assert "no-such-model" in err.message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_output_tokens": 9999}, "max_output_tokens"),
        ({"input": ""}, "input"),
        ({"model": ""}, "model"),
        ({"priority": 42}, "priority"),
        ({"lane": 42}, "lane"),
        ({"session_key": "k" * 1000}, "session_key"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_malformed_request_names_the_field(
    fleet: Any, e2e: SimpleNamespace, fields: dict[str, Any], field: str
) -> None:
    err = e2e.rich_error(lambda: fleet.infer(**fields))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert err.reason == "INVALID_FIELD"
    assert err.domain == DOMAIN
    assert [v.field for v in err.field_violations] == [field], err
    assert err.field_violations[0].description


def test_negative_timeout_is_invalid(fleet: Any, e2e: SimpleNamespace) -> None:
    bad = e2e.duration(0)
    bad.seconds, bad.nanos = -1, 0
    err = e2e.rich_error(lambda: fleet.infer(timeout=bad))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert [v.field for v in err.field_violations] == ["timeout"]


@pytest.mark.parametrize(
    ("key", "reason"),
    [("not-a-key", "INVALID_CREDENTIALS"), (None, "MISSING_CREDENTIALS")],
    ids=["wrong-key", "no-key"],
)
def test_bad_api_key_is_unauthenticated(
    fleet: Any, e2e: SimpleNamespace, key: str | None, reason: str
) -> None:
    err = e2e.rich_error(lambda: fleet.infer(key=key))
    assert err.code == grpc.StatusCode.UNAUTHENTICATED, err
    assert err.reason == reason
    assert err.domain == DOMAIN


def test_unreachable_request_timeout_is_answered_typed_and_early(
    fleet: Any, e2e: SimpleNamespace
) -> None:
    # The request's own timeout (1 ms) is tighter than a call to a replica can be: a typed
    # answer that comes back long before the (generous) gRPC deadline. Refused at admission
    # when the prediction already lands past the deadline (DEADLINE_UNREACHABLE), or evicted
    # from the queue the moment it can no longer make it (DEADLINE_MISSED): on this zero-time
    # fleet the replicas' measured cost is ~0, so which one depends on the gateway's margins.
    started = time.monotonic()
    err = e2e.rich_error(lambda: fleet.infer(timeout=e2e.duration(0.001), deadline_s=10))
    elapsed = time.monotonic() - started
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED, err
    assert err.reason in ("DEADLINE_UNREACHABLE", "DEADLINE_MISSED"), err
    assert err.domain == DOMAIN
    assert elapsed < 2.0
    predicted = err.metadata.get("predicted_completion_ms")
    if err.reason == "DEADLINE_UNREACHABLE" and predicted is not None:
        assert float(predicted) > float(err.metadata["deadline_ms"]), err.metadata


def test_unreachable_grpc_deadline(fleet: Any, e2e: SimpleNamespace) -> None:
    # A 1 ms gRPC deadline: DEADLINE_EXCEEDED, from the gateway's feasibility check, its
    # eviction of a queued request that can no longer make it, or gRPC itself — never a hang,
    # never another code.
    started = time.monotonic()
    err = e2e.rich_error(lambda: fleet.infer(deadline_s=0.001))
    assert time.monotonic() - started < 2.0
    assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED, err
    assert err.reason in (None, "DEADLINE_UNREACHABLE", "DEADLINE_MISSED"), err


def test_fleet_still_serves_after_rejections(fleet: Any) -> None:
    # Rejections must not poison anything: the next ordinary request is answered.
    assert fleet.infer().version == "v1"


def test_get_state_lists_the_fleet(fleet: Any, e2e: SimpleNamespace) -> None:
    state = fleet.get_state()
    members = {m.replica.replica_id: m for m in state.replicas}
    assert set(members) == set(fleet.workers)
    for rid, member in members.items():
        # The address the worker registered is the one it bound (its ready file).
        assert member.replica.address == fleet.workers[rid].grpc
        assert member.replica.model == e2e.MODEL
        assert member.replica.version == "v1"
        assert member.replica.slots >= 1
        assert member.lease_expires_at.ToNanoseconds() > member.registered_at.ToNanoseconds()
    routing = {r.model: r for r in state.routing}
    assert routing[e2e.MODEL].stable_version == "v1"
    assert routing[e2e.MODEL].canary_version == ""


def test_get_state_needs_the_operator_role(fleet: Any, e2e: SimpleNamespace) -> None:
    err = e2e.rich_error(lambda: fleet.get_state(token=e2e.FLEET_TOKEN))
    assert err.code == grpc.StatusCode.PERMISSION_DENIED, err
    assert err.reason == "WRONG_ROLE"

    err = e2e.rich_error(lambda: fleet.get_state(token="not-a-token"))
    assert err.code == grpc.StatusCode.UNAUTHENTICATED, err

    err = e2e.rich_error(lambda: fleet.get_state(token=e2e.API_KEY))
    assert err.code == grpc.StatusCode.UNAUTHENTICATED, err
