"""Shared pieces of the in-process ControlService tests: a real grpc.aio server on 127.0.0.1:0
(started by the ``start_stack`` fixture in ``conftest.py``), real aio clients, and helpers that
wait on conditions with a timeout instead of sleeping."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from common.auth import AuthPolicy, bearer_metadata
from common.errors import RichError, parse_rpc_error
from common.serving import ServiceHost, ServingOptions
from controller.app import Controller, ControllerConfig
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2

FLEET_TOKEN = "test-fleet-token"
OPERATOR_TOKEN = "test-operator-token"
FLEET = bearer_metadata(FLEET_TOKEN)
OPERATOR = bearer_metadata(OPERATOR_TOKEN)
TIMEOUT = 5.0


@dataclass
class Stack:
    host: ServiceHost
    controller: Controller
    channel: grpc.aio.Channel
    stub: control_pb2_grpc.ControlServiceStub
    closed: bool = False

    def metric(self, name: str, **labels: str) -> float | None:
        value = self.host.registry.get_sample_value(name, labels)
        return None if value is None else float(value)


StackFactory = Callable[..., Awaitable[Stack]]


async def open_stack(db_path: Path, listen: str = "127.0.0.1:0", **config: Any) -> Stack:
    """A controller serving on ``listen`` with its store at ``db_path`` (``config`` overrides
    ControllerConfig fields)."""
    auth = AuthPolicy(fleet_token=FLEET_TOKEN, operator_token=OPERATOR_TOKEN)
    host = ServiceHost(
        "controller",
        ServingOptions(listen=listen, metrics_listen=None, grace_s=1.0),
        auth,
    )
    fields: dict[str, Any] = {
        "db_path": db_path,
        "stable": {"resnet": "v1"},
        "lease_ttl_s": 5.0,
        "heartbeat_interval_s": 1.0,
        "coalesce_s": 0.0,
    }
    fields.update(config)
    controller = await Controller.open(ControllerConfig(**fields), metrics_registry=host.registry)
    controller.add_to(host)
    await host.start()
    controller.start()
    host.set_ready(True)
    channel = grpc.aio.insecure_channel(host.grpc_address)
    return Stack(host, controller, channel, control_pb2_grpc.ControlServiceStub(channel))


async def close_stack(stack: Stack) -> None:
    if stack.closed:
        return
    stack.closed = True
    await stack.controller.shutdown()
    await stack.host.stop(0.5)
    await stack.controller.close()
    await stack.channel.close()


def descriptor(
    replica_id: str = "r1", version: str = "v1", model: str = "resnet", **kw: Any
) -> Any:
    fields: dict[str, Any] = {
        "replica_id": replica_id,
        "address": f"127.0.0.1:{6000 + zlib.crc32(replica_id.encode()) % 1000}",
        "model": model,
        "version": version,
        "hardware": "a10g",
        "slots": 2,
        "speed": 1.0,
    }
    return fleet_pb2.ReplicaDescriptor(**{**fields, **kw})


async def register(
    stack: Stack, replica_id: str = "r1", **kw: Any
) -> tuple[Any, control_pb2.Lease]:
    call = stack.stub.WorkerSession(metadata=FLEET)
    await call.write(control_pb2.WorkerSessionRequest(register=descriptor(replica_id, **kw)))
    first = await asyncio.wait_for(call.read(), TIMEOUT)
    assert first.WhichOneof("kind") == "lease"
    return call, first.lease


async def snapshot_where(
    watch: Any, predicate: Callable[[control_pb2.WatchFleetResponse], bool]
) -> control_pb2.WatchFleetResponse:
    deadline = time.monotonic() + TIMEOUT
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("no snapshot satisfied the condition in time")
        snap: control_pb2.WatchFleetResponse = await asyncio.wait_for(watch.read(), remaining)
        assert snap is not grpc.aio.EOF, "WatchFleet ended"
        if predicate(snap):
            return snap


def ids(snap: control_pb2.WatchFleetResponse) -> set[str]:
    return {m.replica.replica_id for m in snap.replicas}


async def rpc_error(awaitable: Awaitable[Any]) -> RichError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return parse_rpc_error(info.value)


async def stream_end(call: Any) -> grpc.StatusCode:
    """Read a stream until it ends; its final status code."""
    deadline = time.monotonic() + TIMEOUT
    try:
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the stream did not end in time"
            if await asyncio.wait_for(call.read(), remaining) is grpc.aio.EOF:
                break
    except grpc.aio.AioRpcError as err:
        return err.code()
    code: grpc.StatusCode = await call.code()
    return code
