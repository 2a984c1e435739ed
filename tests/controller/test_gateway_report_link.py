"""The gateway's outcome reports against a real in-process controller: nothing without a
version is sent, and nothing is lost while the controller is away (resent once it is back)."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import grpc.aio
import pytest
from controller_helpers import FLEET_TOKEN, TIMEOUT, StackFactory, close_stack

from gateway.controller_link import ControllerLink
from halcyon.v1 import control_pb2

K = control_pb2.RequestOutcomeKind


def link_to(address: str) -> tuple[ControllerLink, grpc.aio.Channel]:
    channel = grpc.aio.insecure_channel(address)
    link = ControllerLink(
        channel,
        gateway_id="gw-test",
        fleet_token=FLEET_TOKEN,
        on_snapshot=lambda _snapshot: None,
        report_status=lambda: (32, 0, []),
    )
    return link, channel


async def test_unversioned_outcomes_are_not_recorded(start_stack: StackFactory) -> None:
    stack = await start_stack()
    link, channel = link_to(stack.host.grpc_address)
    link.record_request("resnet", "", "", K.REQUEST_OUTCOME_KIND_SHED, 0.0)
    link.record_request("resnet", "v1", "r1", K.REQUEST_OUTCOME_KIND_OK, 0.02)
    assert await link._send_once()
    assert link.unversioned_outcomes == 1
    window = stack.controller.outcomes.window("resnet", "v1")
    assert (window.ok, window.shed) == (1, 0)
    assert stack.metric("halcyon_controller_dropped_outcomes_total", reason="missing_version") == 0
    await channel.close()


async def test_reports_survive_a_controller_outage(
    start_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    first = await start_stack()
    address, db = first.host.grpc_address, first.controller.store.path
    link, channel = link_to(address)
    await close_stack(first)
    for _ in range(3):
        link.record_request("resnet", "v1", "r1", K.REQUEST_OUTCOME_KIND_ERROR, 0.01)
    with caplog.at_level(logging.DEBUG, logger="halcyon.gateway.controller_link"):
        assert not await link._send_once()
        link.record_request("resnet", "v1", "r1", K.REQUEST_OUTCOME_KIND_OK, 0.01)
        assert not await link._send_once()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "one warning per outage, not one per attempt"
    assert "keeping them to resend" in warnings[0].getMessage()

    second = await start_stack(db_path=db, listen=address)
    # The channel reconnects with its own backoff; the link's loop simply tries again.
    deadline = time.monotonic() + TIMEOUT
    while not await link._send_once():
        assert time.monotonic() < deadline, "reports never got through after the restart"
        await asyncio.sleep(0.05)
    window = second.controller.outcomes.window("resnet", "v1")
    assert (window.error, window.ok) == (3, 1)
    assert link.dropped_outcomes == 0
    assert await link._send_once()  # nothing is sent twice once acknowledged
    assert second.controller.outcomes.window("resnet", "v1").requests == 4
    await channel.close()
