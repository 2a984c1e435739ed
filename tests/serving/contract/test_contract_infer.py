"""The gateway's Infer answers every request the same on both transports (issue #23).

Black-box, through a real channel with identity serializers: for each kind of request the
status code, ErrorInfo reason and metadata, RetryInfo and field violations, on the fast path
and on grpc.aio alike. Also the order of the checks: the size before the credential, the
credential before decoding.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from contract_support import FLEET, MODEL, Served, infer_request, pushback, tenant_key

from common.errors import DOMAIN, NO_RETRY_PUSHBACK, Reason, parse_rpc_error
from halcyon.v1 import infer_pb2

pytestmark = pytest.mark.asyncio(loop_scope="module")

GARBAGE = b"\xff\xff\xff"  # an invalid tag: no InferRequest parses from it
LIMIT_BYTES = 128 * 1024  # the largest Infer request the gateway reads
OVERSIZED = infer_request(input="x" * (LIMIT_BYTES + 1))


async def test_a_valid_request_is_served(gateway: Served) -> None:
    reply = infer_pb2.InferResponse.FromString(await gateway.call(infer_request(), tenant_key()))
    assert reply.output and reply.model == MODEL and reply.version == "v1"


@pytest.mark.parametrize(
    ("metadata", "code", "reason"),
    [
        ((), grpc.StatusCode.UNAUTHENTICATED, Reason.MISSING_CREDENTIALS),
        (tenant_key("not-a-key"), grpc.StatusCode.UNAUTHENTICATED, Reason.INVALID_CREDENTIALS),
        (
            (("authorization", "Bearer not-a-key"),),
            grpc.StatusCode.UNAUTHENTICATED,
            Reason.INVALID_CREDENTIALS,
        ),
        (tenant_key(FLEET), grpc.StatusCode.PERMISSION_DENIED, Reason.WRONG_ROLE),
    ],
    ids=["no-credential", "wrong-key", "wrong-bearer", "fleet-credential"],
)
async def test_credential_refusals(
    gateway: Served, metadata: Any, code: grpc.StatusCode, reason: Reason
) -> None:
    err = await gateway.refusal(infer_request(), metadata)
    assert (err.code, err.reason, err.domain) == (code, reason, DOMAIN)
    assert err.retry_after_s is None
    if reason == Reason.WRONG_ROLE:
        assert err.metadata == {
            "method": "/halcyon.v1.InferService/Infer",
            "required_role": "tenant",
        }


async def test_undecodable_bytes_are_invalid_argument(gateway: Served) -> None:
    err = await gateway.refusal(GARBAGE, tenant_key())
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD)
    assert [(v.field, v.description) for v in err.field_violations] == [
        ("request", "not a valid halcyon.v1.InferRequest")
    ]


async def test_the_credential_is_checked_before_the_bytes_are_decoded(gateway: Served) -> None:
    err = await gateway.refusal(GARBAGE)
    assert (err.code, err.reason) == (grpc.StatusCode.UNAUTHENTICATED, Reason.MISSING_CREDENTIALS)


@pytest.mark.parametrize("metadata", [tenant_key(), (), tenant_key("not-a-key")])
async def test_an_oversized_request_is_refused_before_the_credential(
    gateway: Served, metadata: Any
) -> None:
    failure = await gateway.failure(OVERSIZED, metadata)
    err = parse_rpc_error(failure)
    assert (err.code, err.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.MESSAGE_TOO_LARGE)
    assert err.metadata == {"size_bytes": str(len(OVERSIZED)), "limit_bytes": str(LIMIT_BYTES)}
    assert err.retry_after_s is None
    assert pushback(failure) == NO_RETRY_PUSHBACK  # the same request can never fit


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"input": ""}, "input"),
        ({"max_output_tokens": 5000}, "max_output_tokens"),
        ({"model": ""}, "model"),
    ],
)
async def test_a_bad_field_is_named(gateway: Served, fields: dict[str, Any], field: str) -> None:
    err = await gateway.refusal(infer_request(**fields), tenant_key())
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD)
    assert [v.field for v in err.field_violations] == [field]


async def test_an_unknown_model_is_not_found(gateway: Served) -> None:
    err = await gateway.refusal(infer_request(model="no-such-model"), tenant_key())
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_MODEL)
    assert err.retry_after_s is None
