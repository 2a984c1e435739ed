"""ControllerSession against a small fake ControlService on a real aio server."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import duration_pb2

from common.auth import AuthPolicy
from common.backoff import Backoff
from common.cost_samples import CostSampleValue
from common.rng import SeededRng
from common.serving import ServiceHost, ServingOptions
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2
from worker.registration import ControllerSession

FLEET = "fleet-token-for-registration"
CONTROL = "halcyon.v1.ControlService"


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


@dataclass
class SessionRecord:
    register: fleet_pb2.ReplicaDescriptor
    opened_at: float
    heartbeats: list[fleet_pb2.ReplicaLoad] = field(default_factory=list)
    ended_by_client: bool = False


class FakeController(control_pb2_grpc.ControlServiceServicer):  # type: ignore[misc]
    """Records sessions; can refuse, end a stream after N heartbeats, send a drain or an
    undrain."""

    def __init__(self) -> None:
        self.attempts: list[float] = []
        self.sessions: list[SessionRecord] = []
        self.refuse_next = 0
        self.close_after_heartbeats: int | None = None
        self.drain_after_heartbeats: int | None = None
        self.undrain_after_heartbeats: int | None = None
        self.heartbeat_interval_s = 0.02
        self.ttl_s = 0.1

    async def WorkerSession(
        self, request_iterator: AsyncIterator[control_pb2.WorkerSessionRequest], context: Any
    ) -> AsyncIterator[control_pb2.WorkerSessionResponse]:
        self.attempts.append(time.monotonic())
        if self.refuse_next > 0:
            self.refuse_next -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not now")
        first = await anext(request_iterator)
        assert first.WhichOneof("kind") == "register"
        record = SessionRecord(first.register, time.monotonic())
        self.sessions.append(record)
        yield control_pb2.WorkerSessionResponse(
            lease=control_pb2.Lease(
                replica_id=first.register.replica_id,
                ttl=_duration(self.ttl_s),
                heartbeat_interval=_duration(self.heartbeat_interval_s),
            )
        )
        async for message in request_iterator:
            assert message.WhichOneof("kind") == "heartbeat"
            record.heartbeats.append(message.heartbeat)
            n = len(record.heartbeats)
            if self.drain_after_heartbeats is not None and n >= self.drain_after_heartbeats:
                self.drain_after_heartbeats = None  # once
                yield control_pb2.WorkerSessionResponse(
                    drain=control_pb2.DrainCommand(reason="operator")
                )
            if self.undrain_after_heartbeats is not None and n >= self.undrain_after_heartbeats:
                self.undrain_after_heartbeats = None  # once
                yield control_pb2.WorkerSessionResponse(
                    undrain=control_pb2.UndrainCommand(reason="operator")
                )
            if self.close_after_heartbeats is not None and n >= self.close_after_heartbeats:
                return
        record.ended_by_client = True


@pytest.fixture
async def controller() -> AsyncIterator[tuple[FakeController, ServiceHost]]:
    fake = FakeController()  # type: ignore[abstract]
    host = ServiceHost(
        "fake-controller",
        ServingOptions(metrics_listen=None),
        AuthPolicy(fleet_token=FLEET, operator_token="op"),
    )
    host.add_service(control_pb2_grpc.add_ControlServiceServicer_to_server, fake, CONTROL)
    await host.start()
    yield fake, host
    await host.stop(0)


DESCRIPTOR = fleet_pb2.ReplicaDescriptor(
    replica_id="r1",
    address="127.0.0.1:9",
    model="m",
    version="v1",
    hardware="a10g",
    slots=2,
    speed=0.6,
)


def make_session(host: ServiceHost, **kw: Any) -> ControllerSession:
    drains: list[str] = kw.pop("drains", [])

    async def on_drain(reason: str) -> None:
        drains.append(reason)

    args: dict[str, Any] = {
        "target": host.grpc_address,
        "fleet_token": FLEET,
        "descriptor": lambda: DESCRIPTOR,
        "load": lambda: fleet_pb2.ReplicaLoad(busy_slots=1, batches_total=7),
        "on_drain": on_drain,
        "backoff": Backoff(initial_s=0.02, max_s=0.2, jitter=0.2),
        "rng": SeededRng(5),
    }
    args.update(kw)
    return ControllerSession(**args)


async def test_registers_first_then_heartbeats_with_load(controller: Any, wait_until: Any) -> None:
    fake, host = controller
    session = make_session(host)
    session.start()
    try:
        await session.wait_registered(5)
        await wait_until(lambda: fake.sessions and len(fake.sessions[0].heartbeats) >= 3)
        record = fake.sessions[0]
        assert record.register == DESCRIPTOR
        assert record.heartbeats[0].busy_slots == 1 and record.heartbeats[0].batches_total == 7
        assert session.heartbeat_interval_s == pytest.approx(0.02)
        assert session.lease is not None and session.lease.replica_id == "r1"
    finally:
        await session.close()
    # close() half-closed the stream: the controller saw it end (a prompt deregistration).
    await wait_until(lambda: fake.sessions[0].ended_by_client)
    assert not session.connected
    assert len(fake.sessions) == 1  # and no reconnect after close


async def test_reconnects_with_exponential_backoff(controller: Any, wait_until: Any) -> None:
    fake, host = controller
    fake.refuse_next = 3
    session = make_session(host)
    session.start()
    try:
        await session.wait_registered(5)
    finally:
        await session.close()
    rng = SeededRng(5)
    backoff = Backoff(initial_s=0.02, max_s=0.2, jitter=0.2)
    expected = [backoff.delay(n, rng.random()) for n in range(3)]
    assert list(session.reconnect_delays) == pytest.approx(expected)
    assert expected[0] < expected[1] < expected[2]  # it grows
    gaps = [b - a for a, b in zip(fake.attempts, fake.attempts[1:], strict=False)]
    assert len(gaps) == 3
    assert all(gap >= delay - 0.005 for gap, delay in zip(gaps, expected, strict=True))
    assert session.last_error is not None and "UNAVAILABLE" in session.last_error


async def test_a_session_that_held_a_lease_is_reopened_after_a_short_jittered_delay(
    controller: Any, wait_until: Any
) -> None:
    fake, host = controller
    fake.close_after_heartbeats = 1  # every session ends after one heartbeat
    session = make_session(host)
    session.start()
    try:
        await wait_until(lambda: session.sessions >= 4)  # leases granted (and received)
    finally:
        await session.close()
    # Each stream had a lease: the next one opens after initial_s x U (full jitter), not
    # after the backoff, so a fleet whose controller restarted re-registers at once.
    rng = SeededRng(5)
    expected = [0.02 * rng.random() for _ in session.reconnect_delays]
    assert list(session.reconnect_delays) == pytest.approx(expected), session.last_error
    assert all(s.register == DESCRIPTOR for s in fake.sessions)


def test_reconnect_delay_is_jitter_after_a_lease_and_backoff_after_refusals() -> None:
    backoff = Backoff(initial_s=0.2, max_s=10.0, jitter=0.2)
    session = ControllerSession(
        target="127.0.0.1:9",
        fleet_token=FLEET,
        descriptor=lambda: DESCRIPTOR,
        load=fleet_pb2.ReplicaLoad,
        on_drain=lambda _reason: asyncio.sleep(0),
        backoff=backoff,
        rng=SeededRng(9),
    )
    draws = SeededRng(9)
    assert session.reconnect_delay(7, granted=True) == pytest.approx(0.2 * draws.random())
    assert session.reconnect_delay(7, granted=False) == pytest.approx(
        backoff.delay(7, draws.random())
    )
    assert session.reconnect_delay(7, granted=False) >= 8.0  # refusals do back off


async def test_drain_command_calls_on_drain_once(controller: Any, wait_until: Any) -> None:
    fake, host = controller
    fake.drain_after_heartbeats = 1
    drains: list[str] = []
    session = make_session(host, drains=drains)
    session.start()
    try:
        await wait_until(lambda: drains == ["operator"])
    finally:
        await session.close()


async def test_wrong_credential_is_refused_and_retried(controller: Any, wait_until: Any) -> None:
    fake, host = controller
    session = make_session(host, fleet_token="not-the-fleet-token")
    session.start()
    try:
        await wait_until(lambda: len(session.reconnect_delays) >= 2)
        assert not session.connected and not fake.sessions
        assert session.last_error is not None and session.last_error.startswith("UNAUTHENTICATED")
    finally:
        await session.close()


async def test_heartbeat_can_be_sent_at_once(controller: Any, wait_until: Any) -> None:
    fake, host = controller
    fake.heartbeat_interval_s = 60.0
    session = make_session(host)
    session.start()
    try:
        await session.wait_registered(5)
        assert fake.sessions[0].heartbeats == []
        session.send_heartbeat_now()
        await wait_until(lambda: len(fake.sessions[0].heartbeats) == 1, timeout_s=2.0)
    finally:
        await session.close()


async def test_lease_without_interval_derives_it_from_the_ttl(controller: Any) -> None:
    fake, host = controller
    fake.heartbeat_interval_s = 0.0
    fake.ttl_s = 0.3
    session = make_session(host)
    session.start()
    try:
        await session.wait_registered(5)
        assert session.heartbeat_interval_s == pytest.approx(0.1)
    finally:
        await session.close()


async def test_worker_app_registers_and_drains_on_command(
    controller: Any, start_worker: Any, wait_until: Any
) -> None:
    fake, host = controller
    w = await start_worker(controller=host.grpc_address, fleet_token=FLEET, replica_id="w-1")
    await wait_until(lambda: len(fake.sessions) == 1)
    registered = fake.sessions[0].register
    assert registered.replica_id == "w-1"
    assert registered.address == w.app.host.grpc_address
    fake.drain_after_heartbeats = 2
    await wait_until(lambda: w.app.replica.draining and not w.app.host.ready)
    # Drained, it stays registered and says so in its heartbeats: it can be put back.
    record = fake.sessions[0]
    await wait_until(lambda: record.heartbeats[-1].draining)
    assert w.app.session is not None and w.app.session.connected
    assert not record.ended_by_client

    fake.undrain_after_heartbeats = len(record.heartbeats) + 1
    await wait_until(lambda: not w.app.replica.draining and w.app.host.ready)
    await wait_until(lambda: not record.heartbeats[-1].draining)
    # And a later drain command drains again (a new drain, not the first one's echo).
    fake.drain_after_heartbeats = len(record.heartbeats) + 1
    await wait_until(lambda: w.app.replica.draining and not w.app.host.ready)
    assert len(fake.sessions) == 1 and not record.ended_by_client


async def test_undrain_command_calls_on_undrain(controller: Any, wait_until: Any) -> None:
    fake, host = controller
    undrains: list[str] = []

    async def on_undrain(reason: str) -> None:
        undrains.append(reason)

    fake.undrain_after_heartbeats = 1
    session = make_session(host, on_undrain=on_undrain)
    session.start()
    try:
        await wait_until(lambda: undrains == ["operator"])
    finally:
        await session.close()


async def test_close_is_prompt_while_waiting_for_an_unreachable_controller(
    wait_until: Any,
) -> None:
    port = _free_port()

    async def on_drain(reason: str) -> None:
        raise AssertionError("no drain expected")

    session = ControllerSession(
        target=f"127.0.0.1:{port}",
        fleet_token=FLEET,
        descriptor=lambda: DESCRIPTOR,
        load=fleet_pb2.ReplicaLoad,
        on_drain=on_drain,
        backoff=Backoff(initial_s=30.0, max_s=30.0),
    )
    session.start()
    await asyncio.sleep(0.3)  # waiting for the controller to exist, not failing and backing off
    assert not session.connected and not session.reconnect_delays
    started = time.monotonic()
    await session.close()
    assert time.monotonic() - started < 1.0


async def test_a_restarted_controller_is_rejoined_within_a_second_of_listening(
    wait_until: Any,
) -> None:
    """The controller goes away for longer than the backoff has grown and comes back on the
    same address: the worker re-registers within about a second (the channel's connection
    retry), not after its next backoff step (with this backoff, ~2 s later)."""
    port = _free_port()
    _, first_host = await _fake_controller(port)
    session = make_session(first_host, backoff=Backoff(initial_s=0.3, max_s=30.0, jitter=0.0))
    session.start()
    try:
        await session.wait_registered(5)
        await first_host.stop(0)
        await wait_until(lambda: not session.connected)
        await asyncio.sleep(2.2)  # refused connections all along: the old loop was at 0.3, 0.9, 2.1
        second, second_host = await _fake_controller(port)
        back = time.monotonic()
        try:
            await session.wait_registered(5)
            rejoined = time.monotonic() - back
            assert len(second.sessions) == 1 and second.sessions[0].register == DESCRIPTOR
            assert rejoined < 1.5, f"re-registered {rejoined:.2f} s after the controller came back"
        finally:
            await session.close()
            await second_host.stop(0)
    finally:
        await session.close()


def _free_port() -> int:
    with socket.socket() as s:  # a port nobody listens on (until a test starts a server there)
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _fake_controller(port: int) -> tuple[FakeController, ServiceHost]:
    fake = FakeController()  # type: ignore[abstract]
    host = ServiceHost(
        "fake-controller",
        ServingOptions(listen=f"127.0.0.1:{port}", metrics_listen=None),
        AuthPolicy(fleet_token=FLEET, operator_token="op"),
    )
    host.add_service(control_pb2_grpc.add_ControlServiceServicer_to_server, fake, CONTROL)
    await host.start()
    return fake, host


async def test_a_stream_cancelled_under_the_reader_is_a_broken_session_not_the_end(
    controller: Any, wait_until: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed heartbeat write cancels the call, and gRPC then raises CancelledError in the
    reader: that must reconnect like any broken stream, not end the keep-registered loop."""
    _, host = controller
    session = make_session(host)
    real = session._session_once
    calls = 0

    async def broken_once() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise asyncio.CancelledError  # what call.read() raises after call.cancel()
        return await real()

    monkeypatch.setattr(session, "_session_once", broken_once)
    session.start()
    try:
        await session.wait_registered(5)
        assert session.last_error is not None and "broke" in session.last_error
        assert len(session.reconnect_delays) == 1
    finally:
        await session.close()


async def test_worker_app_registers_with_its_warm_up_even_when_every_batch_fails(
    controller: Any, start_worker: Any, wait_until: Any
) -> None:
    """Warm-up batches run before registering, without injected faults (a --fail-rate 1
    worker still registers), and their measured cost goes with the registration."""
    fake, host = controller
    w = await start_worker(
        controller=host.grpc_address, fleet_token=FLEET, replica_id="w-warm", fail_rate=1.0
    )
    await wait_until(lambda: len(fake.sessions) == 1)
    registered = fake.sessions[0].register
    assert registered.runtime == "simulated"
    samples = [CostSampleValue.from_proto(s) for s in registered.warmup]
    assert len(samples) == 2 and samples[0].batch_tokens != samples[1].batch_tokens
    for s in samples:  # the fixture's device: 20 ms + 0.01 ms per token, no jitter
        assert s.seconds == pytest.approx((20.0 + 0.01 * s.batch_tokens) / 1000.0, rel=0.5)
        assert s.items >= 1 and s.longest_output_tokens <= s.batch_tokens
    assert w.app.identity is not None
    assert [(s.batch_tokens, pytest.approx(s.seconds, abs=1e-9)) for s in samples] == [
        (s.batch_tokens, s.seconds) for s in w.app.identity.warmup
    ]


async def test_no_warm_up_registers_without_samples(
    controller: Any, start_worker: Any, wait_until: Any
) -> None:
    fake, host = controller
    await start_worker(
        controller=host.grpc_address, fleet_token=FLEET, replica_id="w-cold", warm_up=False
    )
    await wait_until(lambda: len(fake.sessions) == 1)
    assert fake.sessions[0].register.runtime == "simulated"
    assert len(fake.sessions[0].register.warmup) == 0
