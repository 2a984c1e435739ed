"""The gateway's two streams to the controller, kept alive with backoff.

* ``WatchFleet`` (server stream): fleet snapshots in, applied as they arrive (the first of
  each stream marked as such, see :mod:`gateway.fleet_state`).
* ``ReportOutcomes`` (client stream): request and batch outcomes out, flushed every second.

The data path never waits on either. If the controller goes away the gateway keeps serving
on the last snapshot, outcome reports queue in a bounded buffer (oldest dropped first, and
counted), and both streams reconnect with capped exponential backoff and jitter. An
unreachable controller is waited for by the channel (``wait_for_ready``; connection attempts
at most a second apart), so a restarted one is resubscribed to within about a second; the
backoff is for refusals. A stream that ended after delivering snapshots is resubscribed after
the first, short backoff step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import grpc

from common.auth import bearer_metadata
from common.backoff import Backoff
from common.durations import set_duration
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2

log = logging.getLogger("halcyon.gateway.controller_link")

MAX_BUFFERED_OUTCOMES = 50_000

# (model, version, replica id, RequestOutcomeKind, latency seconds)
OutcomeRecord = tuple[str, str, str, int, float]


class ControllerLink:
    """Subscribes to fleet snapshots and streams outcome reports."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        gateway_id: str,
        fleet_token: str,
        on_snapshot: Callable[[control_pb2.WatchFleetResponse, bool], None],
        report_status: Callable[[], tuple[int, int, list[fleet_pb2.CostModel]]],
        report_interval_s: float = 1.0,
    ) -> None:
        self._stub = control_pb2_grpc.ControlServiceStub(channel)
        self._gateway_id = gateway_id
        self._metadata = bearer_metadata(fleet_token)
        self._on_snapshot = on_snapshot
        self._report_status = report_status
        self._interval = report_interval_s
        # Raw tuples on the data path; protobuf is built once per report, off the hot path.
        self._requests: deque[OutcomeRecord] = deque(maxlen=MAX_BUFFERED_OUTCOMES)
        self._batches: deque[control_pb2.BatchOutcome] = deque(maxlen=MAX_BUFFERED_OUTCOMES)
        self.dropped_outcomes = 0
        self.connected = False
        self._next_attempt_at: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._backoff = Backoff(initial_s=0.1, max_s=5.0)
        self._rng = random.Random()

    # -- outcomes (called on the data path: O(1), never blocks) --------------------------
    def record_request(
        self, model: str, version: str, replica_id: str, kind: int, latency_s: float
    ) -> None:
        if len(self._requests) == self._requests.maxlen:
            self.dropped_outcomes += 1
        self._requests.append((model, version, replica_id, kind, latency_s))

    def record_batch(self, outcome: control_pb2.BatchOutcome) -> None:
        if len(self._batches) == self._batches.maxlen:
            self.dropped_outcomes += 1
        self._batches.append(outcome)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch_forever(), name="watch-fleet"),
            asyncio.create_task(self._report_forever(), name="report-outcomes"),
        ]

    async def stop(self, flush: bool = True) -> None:
        if flush:
            # One last report so the controller sees the outcomes of a draining gateway.
            with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError):
                await asyncio.wait_for(self._send_once(), timeout=1.0)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _watch_forever(self) -> None:
        attempt = 0
        while True:
            try:
                stream = self._stub.WatchFleet(
                    control_pb2.WatchFleetRequest(gateway_id=self._gateway_id),
                    metadata=self._metadata,
                    wait_for_ready=True,  # an unreachable controller is waited for, not retried
                )
                first = True
                async for snapshot in stream:
                    if first:
                        log.info(
                            "subscribed to fleet",
                            extra={
                                "generation": snapshot.generation,
                                "warming_up": snapshot.warming_up,
                            },
                        )
                    self.connected = True
                    attempt = 0
                    self._on_snapshot(snapshot, first)
                    first = False
                if self.connected:
                    log.warning("the controller closed the fleet stream; resubscribing")
                self.connected = False
                await self._wait_to_retry(attempt)
                attempt += 1
            except grpc.aio.AioRpcError as err:
                if self.connected:
                    log.warning(
                        "lost the controller; serving on the last fleet snapshot",
                        extra={"code": err.code().name, "detail": err.details()},
                    )
                self.connected = False
                if err.code() in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                ):
                    log.error(
                        "the controller refused the fleet credential",
                        extra={"detail": err.details()},
                    )
                await self._wait_to_retry(attempt)
                attempt += 1

    async def _wait_to_retry(self, attempt: int) -> None:
        delay = self._backoff.delay(attempt, self._rng.random())
        self._next_attempt_at = time.monotonic() + delay
        await asyncio.sleep(delay)

    def retry_hint(self) -> float:
        """Seconds until the gateway can expect a fleet snapshot: the time to the next
        resubscription attempt while disconnected, else one report interval."""
        if not self.connected and self._next_attempt_at is not None:
            return max(self._interval / 10, self._next_attempt_at - time.monotonic())
        return self._interval

    def _drain_buffers(self) -> control_pb2.ReportOutcomesRequest:
        """Everything recorded since the last report, plus the gateway's status (sent even when
        nothing happened, so GetState shows a live gateway with its limit)."""
        limit, inflight, models = self._report_status()
        report = control_pb2.ReportOutcomesRequest(
            gateway_id=self._gateway_id,
            batches=self._batches,
            concurrency_limit=limit,
            inflight=inflight,
            cost_models=models,
        )
        # One outcome per request, built in place rather than built and copied in: the
        # cheapest form for thousands a second.
        add = report.requests.add
        for model, version, replica_id, kind, latency_s in self._requests:
            outcome = add(model=model, version=version, replica_id=replica_id, kind=kind)
            set_duration(outcome.latency, latency_s)
        self._requests.clear()
        self._batches.clear()
        return report

    async def _reports(self) -> AsyncIterator[control_pb2.ReportOutcomesRequest]:
        while True:
            yield self._drain_buffers()
            await asyncio.sleep(self._interval)

    async def _report_forever(self) -> None:
        attempt = 0
        while True:
            try:
                await self._stub.ReportOutcomes(self._reports(), metadata=self._metadata)
                attempt = 0
            except grpc.aio.AioRpcError:
                await asyncio.sleep(self._backoff.delay(attempt, self._rng.random()))
                attempt += 1

    async def _send_once(self) -> None:
        report = self._drain_buffers()

        async def one() -> AsyncIterator[control_pb2.ReportOutcomesRequest]:
            yield report

        await self._stub.ReportOutcomes(one(), metadata=self._metadata)
