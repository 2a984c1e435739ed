"""The worker's ExecuteBatch answers every request the same on both transports (issue #23).

Black-box, through a real channel with identity serializers: the status code, ErrorInfo
reason and metadata and field violations for each kind of request, on the fast path and on
grpc.aio alike, and the credential checked before the bytes are decoded.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from contract_support import FLEET, MODEL, OPERATOR, REPLICA_ID, Served, batch_request

from common.auth import bearer_metadata
from common.errors import DOMAIN, Reason
from common.serving import MAX_RECEIVE_MESSAGE_BYTES
from halcyon.v1 import worker_pb2

pytestmark = pytest.mark.asyncio(loop_scope="module")

GARBAGE = b"\xff\xff\xff"  # an invalid tag: no ExecuteBatchRequest parses from it


async def test_a_valid_batch_is_served(worker: Served) -> None:
    reply = worker_pb2.ExecuteBatchResponse.FromString(
        await worker.call(batch_request(), bearer_metadata(FLEET))
    )
    assert [r.id for r in reply.results] == ["a"] and reply.batch_tokens == 4


@pytest.mark.parametrize(
    ("metadata", "code", "reason"),
    [
        ((), grpc.StatusCode.UNAUTHENTICATED, Reason.MISSING_CREDENTIALS),
        (bearer_metadata("guess"), grpc.StatusCode.UNAUTHENTICATED, Reason.INVALID_CREDENTIALS),
        (bearer_metadata(OPERATOR), grpc.StatusCode.PERMISSION_DENIED, Reason.WRONG_ROLE),
    ],
    ids=["no-credential", "wrong-credential", "operator-credential"],
)
@pytest.mark.parametrize("body", [batch_request(), GARBAGE], ids=["batch", "undecodable"])
async def test_credential_refusals_come_before_decoding(
    worker: Served, metadata: Any, code: grpc.StatusCode, reason: Reason, body: bytes
) -> None:
    err = await worker.refusal(body, metadata)
    assert (err.code, err.reason, err.domain) == (code, reason, DOMAIN)
    assert err.retry_after_s is None


async def test_undecodable_bytes_are_invalid_argument(worker: Served) -> None:
    err = await worker.refusal(GARBAGE, bearer_metadata(FLEET))
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD)
    assert [(v.field, v.description) for v in err.field_violations] == [
        ("request", "not a valid halcyon.v1.ExecuteBatchRequest")
    ]


async def test_a_request_over_the_receive_limit_is_resource_exhausted(worker: Served) -> None:
    # gRPC's own limit: the core refuses it before any handler, on either transport.
    items = [worker_pb2.BatchItem(id="a", input="x" * MAX_RECEIVE_MESSAGE_BYTES)]
    err = await worker.refusal(batch_request(items=items), bearer_metadata(FLEET))
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("items", "field"),
    [
        ([], "items"),
        ([worker_pb2.BatchItem(id="", input_tokens=1)], "items[0].id"),
        ([worker_pb2.BatchItem(id="a")], "items[0].input_tokens"),
    ],
)
async def test_a_bad_field_is_named(worker: Served, items: Any, field: str) -> None:
    err = await worker.refusal(batch_request(items=items), bearer_metadata(FLEET))
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD)
    assert [v.field for v in err.field_violations] == [field]


async def test_a_batch_for_another_model_is_wrong_model(worker: Served) -> None:
    err = await worker.refusal(batch_request(model="no-such-model"), bearer_metadata(FLEET))
    assert (err.code, err.reason) == (grpc.StatusCode.FAILED_PRECONDITION, Reason.WRONG_MODEL)
    assert err.metadata == {"replica_id": REPLICA_ID, "model": MODEL, "version": "v1"}
