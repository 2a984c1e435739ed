"""Answers that need a server of the test's own, the same on both transports (issue #23):
a bug in a handler (INTERNAL with reason INTERNAL, never UNKNOWN or a bare INTERNAL), a
refusal with retry advice (RetryInfo and the pushback trailer), and a call during shutdown
(UNAVAILABLE / SHUTTING_DOWN), for the gateway's Infer and the worker's ExecuteBatch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from contract_support import MODEL, Running, batch_request, infer_request, pushback

from common.errors import Reason, parse_rpc_error
from gateway.app import GatewayApp
from halcyon.v1 import control_pb2
from worker.app import WorkerApp

pytestmark = pytest.mark.asyncio(loop_scope="module")

Start = Callable[..., Awaitable[Running]]


def _request(service: str) -> bytes:
    return infer_request() if service == "gateway" else batch_request()


def _bug(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("a bug")


async def _async_bug(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("a bug")


@pytest.mark.parametrize(
    ("service", "where"),
    [
        ("gateway", "admit"),  # deciding on the request, before it is queued
        ("gateway", "settle"),  # building the answer, after its batch came back
        ("worker", "replica"),  # running the batch
        ("worker", "servicer"),  # the method's handler itself
    ],
)
async def test_a_bug_is_internal_with_a_reason(
    start_own: Start,
    monkeypatch: pytest.MonkeyPatch,
    service: str,
    where: str,
) -> None:
    running = await start_own(service)
    app = running.app
    if isinstance(app, GatewayApp):
        monkeypatch.setattr(app, where, _bug)
    else:
        assert isinstance(app, WorkerApp)
        target = app.replica if where == "replica" else app.servicer
        monkeypatch.setattr(target, "execute", _async_bug)
    # A short deadline: an unanswered call fails the test in 2 s, not 10.
    err = await running.served.refusal(_request(service), running.served.credential, deadline_s=2.0)
    assert (err.code, err.reason) == (grpc.StatusCode.INTERNAL, Reason.INTERNAL)


async def test_no_replica_for_a_routed_model_is_unavailable_with_retry_advice(
    start_own: Start,
) -> None:
    running = await start_own("gateway")
    assert isinstance(running.app, GatewayApp) and running.behind is not None
    identity = running.behind.identity
    assert identity is not None
    running.app.apply_snapshot(
        control_pb2.WatchFleetResponse(
            generation=2,
            replicas=[control_pb2.FleetMember(replica=identity.to_proto())],
            routing=[
                control_pb2.ModelRouting(model=MODEL, stable_version="v1"),
                control_pb2.ModelRouting(model="idle-model", stable_version="v1"),
            ],
        )
    )
    served = running.served
    failure = await served.failure(infer_request(model="idle-model"), served.credential)
    err = parse_rpc_error(failure)
    assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, Reason.NO_CAPACITY)
    assert err.retry_after_s is not None and err.retry_after_s > 0
    assert pushback(failure) == str(err.pushback_ms())  # the same advice for gRPC's retries


@pytest.mark.parametrize("service", ["gateway", "worker"])
async def test_a_call_while_the_server_stops_is_shutting_down(
    start_own: Start, service: str
) -> None:
    running = await start_own(service)
    served = running.served
    await served.call(_request(service), served.credential)  # the channel is connected
    await served.host.quiesce()  # the stop's first step: new calls are held until the stop
    request, credential = _request(service), served.credential
    until_stop = asyncio.ensure_future(served.refusal(request, credential, deadline_s=10.0))
    # A held call is answered just before its deadline if the stop has not come by then ...
    near_deadline = await served.refusal(request, credential, deadline_s=1.0)
    # ... and at once when it does.
    await served.host.stop(1.0)
    for err in (near_deadline, await until_stop):
        assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, Reason.SHUTTING_DOWN)
        assert err.retry_after_s is None


async def test_infer_while_the_gateway_shuts_down_is_shutting_down(start_own: Start) -> None:
    running = await start_own("gateway")
    assert isinstance(running.app, GatewayApp)
    await running.app.shutdown(grace_s=0.1)
    served = running.served
    err = await served.refusal(infer_request(), served.credential)
    assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, Reason.SHUTTING_DOWN)
    assert err.retry_after_s is None
