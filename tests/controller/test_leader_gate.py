"""A standby controller's gate (common.leader_gate) on a real host, and the clients' choice of
the next controller (common.controller_targets): a worker given a standby first registers
with the leader it names.

The gate is one layer of the serving pipeline: unary and streaming calls alike are refused
UNAVAILABLE/NOT_LEADER naming the leader, with RetryInfo 1 s, while health and GetState are
served; once the controller leads every call passes.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from controller_helpers import (
    FLEET,
    FLEET_TOKEN,
    OPERATOR,
    OPERATOR_TOKEN,
    StackFactory,
    descriptor,
    rpc_error,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.auth import AuthPolicy
from common.backoff import Backoff
from common.controller_targets import ControllerTargets, controller_addresses
from common.errors import Reason, RichError, unavailable
from common.leader_gate import LeaderGate
from common.serving import ServiceHost, ServingOptions
from controller.app import Controller, ControllerConfig
from controller.main import STANDBY_SERVES
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2
from worker.registration import ControllerSession

LEADER = "10.1.2.3:50050"


@asynccontextmanager
async def standby_host(
    tmp_path: Path, leader: str
) -> AsyncIterator[tuple[LeaderGate, ServiceHost]]:
    host = ServiceHost(
        "controller",
        ServingOptions(listen="127.0.0.1:0", metrics_listen=None, grace_s=0.5),
        AuthPolicy(fleet_token=FLEET_TOKEN, operator_token=OPERATOR_TOKEN),
    )
    gate = LeaderGate(STANDBY_SERVES, lambda: leader)
    host.add_layer(gate)
    config = ControllerConfig(db_path=tmp_path / "standby.sqlite", stable={"resnet": "v1"})
    controller = await Controller.open(config, metrics_registry=host.registry, active=False)
    controller.add_to(host)
    await host.start()
    try:
        yield gate, host
    finally:
        await host.stop(0.2)
        await controller.close()


@pytest.fixture
async def standby(tmp_path: Path) -> AsyncIterator[tuple[LeaderGate, grpc.aio.Channel]]:
    async with standby_host(tmp_path, LEADER) as (gate, host):
        channel = grpc.aio.insecure_channel(host.grpc_address)
        try:
            yield gate, channel
        finally:
            await channel.close()


def refused_not_leader(err: RichError) -> None:
    assert err.code is grpc.StatusCode.UNAVAILABLE
    assert err.reason == Reason.NOT_LEADER
    assert err.metadata["leader"] == LEADER
    assert err.retry_after_s == 1.0


async def test_a_standby_serves_reads_and_refuses_the_rest(
    standby: tuple[LeaderGate, grpc.aio.Channel],
) -> None:
    _, channel = standby
    stub = control_pb2_grpc.ControlServiceStub(channel)
    await stub.GetState(control_pb2.GetStateRequest(), metadata=OPERATOR, timeout=5)
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    write = stub.PauseRollout(
        control_pb2.PauseRolloutRequest(model="resnet"), metadata=OPERATOR, timeout=5
    )
    refused_not_leader(await rpc_error(write))
    watch = stub.WatchFleet(control_pb2.WatchFleetRequest(gateway_id="g"), metadata=FLEET)
    refused_not_leader(await rpc_error(watch.read()))
    session = stub.WorkerSession(metadata=FLEET)
    refused_not_leader(await rpc_error(session.read()))


async def test_once_leading_every_call_passes(
    standby: tuple[LeaderGate, grpc.aio.Channel],
) -> None:
    gate, channel = standby
    gate.lead()
    stub = control_pb2_grpc.ControlServiceStub(channel)
    err = await rpc_error(
        stub.PauseRollout(
            control_pb2.PauseRolloutRequest(model="resnet"), metadata=OPERATOR, timeout=5
        )
    )
    assert err.reason == Reason.NO_ACTIVE_ROLLOUT  # the servicer answered


async def test_unauthenticated_calls_are_refused_before_the_gate(
    standby: tuple[LeaderGate, grpc.aio.Channel],
) -> None:
    _, channel = standby
    stub = control_pb2_grpc.ControlServiceStub(channel)
    err = await rpc_error(stub.PauseRollout(control_pb2.PauseRolloutRequest(model="m")))
    assert err.code is grpc.StatusCode.UNAUTHENTICATED


async def test_a_worker_given_the_standby_first_registers_with_the_leader(
    tmp_path: Path, start_stack: StackFactory
) -> None:
    leader = await start_stack()
    async with standby_host(tmp_path, leader.host.grpc_address) as (_, host):
        session = ControllerSession(
            target=f"{host.grpc_address},{leader.host.grpc_address}",
            fleet_token=FLEET_TOKEN,
            descriptor=lambda: descriptor("r1"),
            load=fleet_pb2.ReplicaLoad,
            on_drain=lambda _reason: asyncio.sleep(0),
            backoff=Backoff(initial_s=0.05, max_s=0.2),
        )
        session.start()
        try:
            await session.wait_registered(5.0)
            assert session.target == leader.host.grpc_address
            assert "standby" in (session.last_error or ""), session.last_error
        finally:
            await session.close()


def not_leader(leader: str | None) -> RichError:
    err = unavailable(Reason.NOT_LEADER, "standby", 1.0)
    if leader:
        err.metadata["leader"] = leader
    return err


def test_targets_follow_the_named_leader_or_take_the_next() -> None:
    targets = ControllerTargets("a:1, b:2,c:3")
    assert targets.addresses == ["a:1", "b:2", "c:3"] and targets.several
    assert targets.move_on(not_leader("c:3")) and targets.current == "c:3"
    assert targets.move_on(not_leader(None)) and targets.current == "a:1"
    assert targets.move_on(unavailable(Reason.SHUTTING_DOWN, "bye", None))
    assert targets.current == "b:2"
    refused = RichError(grpc.StatusCode.PERMISSION_DENIED, "no", Reason.WRONG_ROLE)
    assert not targets.move_on(refused) and targets.current == "b:2"


def test_one_address_moves_only_to_a_named_leader() -> None:
    targets = ControllerTargets("svc:50050")
    assert not targets.several
    assert not targets.move_on(not_leader(None))
    assert targets.move_on(not_leader("10.0.0.9:50050"))
    assert targets.addresses == ["svc:50050", "10.0.0.9:50050"]


def test_the_flag_checks_every_address() -> None:
    assert controller_addresses("a:1,b:2") == "a:1,b:2"
    with pytest.raises(argparse.ArgumentTypeError):
        controller_addresses("a:1,b")
    with pytest.raises(argparse.ArgumentTypeError):
        controller_addresses(" , ")
