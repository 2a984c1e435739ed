"""The gateway's two streams to the controller, kept alive with backoff.

* ``WatchFleet`` (server stream): fleet snapshots in, applied as they arrive (the first of
  each stream marked as such, see :mod:`gateway.fleet_state`).
* ``ReportOutcomes`` (client stream): request and batch outcomes out, one report a second.

The data path never waits on either. If the controller goes away the gateway keeps serving
on the last snapshot, outcome reports queue in a bounded buffer (oldest dropped first, and
counted: ``halcyon_gateway_dropped_outcome_reports_total``), and both streams reconnect with
capped exponential backoff and jitter. An unreachable controller is waited for by the channel
(``wait_for_ready``; connection attempts at most a second apart), so a restarted one is
resubscribed to within about a second; the backoff is for refusals. A stream that ended
after delivering snapshots is resubscribed after the first, short backoff step.

Several controllers (``--controller a,b``, issue #22; ``channel_for`` opens a channel to an
address): a fleet stream refused or lost ``UNAVAILABLE`` — a standby's ``NOT_LEADER``, a
controller gone — moves both streams to the leader the refusal names or the next address
(:mod:`common.controller_targets`), with the same backoff; with several addresses an
unreachable controller is not waited for, since the leader may be dead for good.

Outcome reports are the evidence canaries are judged on, so a report is only forgotten once
the controller has acknowledged it: each second's report is sent with the ones still unsent in
one ``ReportOutcomes`` call, and the response's ``reports_received`` says how many arrived (a
controller shutting down ends the call early with an honest count). A failed call is logged
and its reports stay queued for the next attempt — delivery is at least once: a connection
lost after the controller counted a report but before it answered makes it count again on
resend, which is rare and far better than losing every outcome of an outage. Outcomes without
a version (no fleet snapshot yet, or a model with no stable version) are not evidence for any
version and are not recorded.

Each report also carries the gateway's status for GetState and the operator console, read
from the state's one owner when the report is built (once per interval, never per request):
the limiter's limit and the in-flight count, the learned cost models, each replica's breaker
state (the routers'), and requests shed by reason and traffic per tenant (the metrics'
counters, :meth:`gateway.metrics.GatewayMetrics.shed_totals` and ``tenant_totals``). Shed and
tenant counts are cumulative since the gateway started, as its Prometheus counters are, so a
lost or repeated report costs the controller nothing; the controller turns them into rates.
At most :data:`MAX_REPORTED_TENANTS` tenants are named (in name order, so the set is stable
from report to report); the rest are summed as :data:`OTHER_TENANTS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from common.auth import bearer_metadata
from common.backoff import Backoff
from common.controller_targets import ControllerTargets
from common.durations import set_duration
from common.errors import parse_rpc_error
from gateway.admission.quota_shares import TenantDemandReport
from gateway.metrics import TenantTotals
from gateway.routing.breaker import BreakerState
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2

log = logging.getLogger("halcyon.gateway.controller_link")

MAX_BUFFERED_OUTCOMES = 50_000
REPORT_TIMEOUT_S = 5.0

# Tenants named in one report; the rest are summed under OTHER_TENANTS.
MAX_REPORTED_TENANTS = 256
OTHER_TENANTS = "(other)"

# (model, version, replica id, RequestOutcomeKind, latency seconds)
OutcomeRecord = tuple[str, str, str, int, float]

_BREAKER_STATES = {
    BreakerState.CLOSED: control_pb2.BREAKER_STATE_CLOSED,
    BreakerState.OPEN: control_pb2.BREAKER_STATE_OPEN,
    BreakerState.HALF_OPEN: control_pb2.BREAKER_STATE_HALF_OPEN,
}


@dataclass(frozen=True)
class GatewayHealth:
    """What a report says of the gateway beyond its limiter: read from their owners on the loop.

    ``breakers``: (replica id, state) for every replica a router holds; ``sheds``: requests
    shed so far by reason; ``tenants``: each tenant's calls so far (both cumulative);
    ``demands``: each tenant's measured demand now, with its contract (the controller splits
    the contract among the gateways by it, ``controller.quotas``).
    """

    breakers: Sequence[tuple[str, BreakerState]] = ()
    sheds: Mapping[str, int] = field(default_factory=dict)
    tenants: Mapping[str, TenantTotals] = field(default_factory=dict)
    demands: Sequence[TenantDemandReport] = ()


def add_health(report: control_pb2.ReportOutcomesRequest, health: GatewayHealth) -> None:
    """Fill ``report``'s ``breakers``, ``sheds`` and ``tenants`` from ``health``; tenants capped
    at :data:`MAX_REPORTED_TENANTS` in name order, the rest summed as :data:`OTHER_TENANTS`."""
    for rid, state in sorted(health.breakers):
        report.breakers.add(replica_id=rid, state=_BREAKER_STATES[state])
    for reason, count in sorted(health.sheds.items()):
        report.sheds.add(reason=reason, count=count)
    names = sorted(health.tenants)
    rows = [(name, health.tenants[name]) for name in names[:MAX_REPORTED_TENANTS]]
    if len(names) > MAX_REPORTED_TENANTS:
        other = TenantTotals()
        for name in names[MAX_REPORTED_TENANTS:]:
            other.add(health.tenants[name])
        rows.append((OTHER_TENANTS, other))
    for name, t in rows:
        report.tenants.add(
            tenant=name,
            requests=t.requests,
            admitted=t.admitted,
            quota_refused=t.quota_refused,
            shed=t.shed,
            ok=t.ok,
            errors=t.errors,
        )
    for d in health.demands:
        report.demands.add(
            tenant=d.tenant,
            rate_per_s=d.rate,
            contract_rate_per_s=d.contract_rate,
            contract_burst=d.contract_burst,
        )


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
        report_health: Callable[[], GatewayHealth] | None = None,
        *,
        targets: ControllerTargets | None = None,
        channel_for: Callable[[str], grpc.aio.Channel] | None = None,
    ) -> None:
        """``channel`` reaches ``targets.current``; with several ``targets``, ``channel_for``
        opens a channel to another (the link closes those it opened, in :meth:`stop`)."""
        self._stub = control_pb2_grpc.ControlServiceStub(channel)
        self._targets = targets
        self._channel_for = channel_for
        self._channels: dict[str, grpc.aio.Channel] = (
            {targets.current: channel} if targets is not None else {}
        )
        self._own_channels: list[grpc.aio.Channel] = []
        self._gateway_id = gateway_id
        self._metadata = bearer_metadata(fleet_token)
        self._on_snapshot = on_snapshot
        self._report_status = report_status
        self._report_health = report_health
        self._interval = report_interval_s
        # Raw tuples on the data path; protobuf is built once per report, off the hot path.
        self._requests: deque[OutcomeRecord] = deque(maxlen=MAX_BUFFERED_OUTCOMES)
        self._batches: deque[control_pb2.BatchOutcome] = deque(maxlen=MAX_BUFFERED_OUTCOMES)
        # Outcomes dropped unacknowledged (a full buffer or the oldest reports): a running
        # total, exported as halcyon_gateway_dropped_outcome_reports_total (dropped_total).
        self.dropped_outcomes = 0
        # Outcomes with no version: not recorded (they are evidence for no version).
        self.unversioned_outcomes = 0
        # Built reports the controller has not acknowledged yet, oldest first.
        self._unsent: deque[control_pb2.ReportOutcomesRequest] = deque()
        self._send_lock = asyncio.Lock()
        self._report_failures = 0
        self.connected = False
        self._next_attempt_at: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._backoff = Backoff(initial_s=0.1, max_s=5.0)
        self._rng = random.Random()

    def dropped_total(self) -> int:
        """Outcomes dropped so far (never decreases; read from any thread, e.g. at a scrape)."""
        return self.dropped_outcomes

    # -- outcomes (called on the data path: O(1), never blocks) --------------------------
    def record_request(
        self, model: str, version: str, replica_id: str, kind: int, latency_s: float
    ) -> None:
        if not version:
            self.unversioned_outcomes += 1
            return
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._send_once(), timeout=1.0)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._own_channels:
            await channel.close()

    @property
    def _several(self) -> bool:
        return self._targets is not None and self._channel_for is not None and self._targets.several

    def _move_on(self, err: grpc.aio.AioRpcError) -> None:
        """After the fleet stream failed: the next controller, if there is another."""
        targets, channel_for = self._targets, self._channel_for
        if targets is None or channel_for is None or not targets.move_on(parse_rpc_error(err)):
            return
        channel = self._channels.get(targets.current)
        if channel is None:
            channel = self._channels[targets.current] = channel_for(targets.current)
            self._own_channels.append(channel)
        self._stub = control_pb2_grpc.ControlServiceStub(channel)
        log.info("trying another controller", extra={"controller": targets.current})

    async def _watch_forever(self) -> None:
        attempt = 0
        while True:
            try:
                stream = self._stub.WatchFleet(
                    control_pb2.WatchFleetRequest(gateway_id=self._gateway_id),
                    metadata=self._metadata,
                    # An unreachable controller is waited for, not retried (unless there are
                    # others to try).
                    wait_for_ready=not self._several,
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
                self._move_on(err)
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
        if self._report_health is not None:
            add_health(report, self._report_health())
        # One outcome per request, built in place rather than built and copied in: the
        # cheapest form for thousands a second.
        add = report.requests.add
        for model, version, replica_id, kind, latency_s in self._requests:
            outcome = add(model=model, version=version, replica_id=replica_id, kind=kind)
            set_duration(outcome.latency, latency_s)
        self._requests.clear()
        self._batches.clear()
        return report

    @staticmethod
    def _items(report: control_pb2.ReportOutcomesRequest) -> int:
        return len(report.requests) + len(report.batches)

    def _queue_report(self) -> None:
        """Move everything recorded into a report behind the unsent ones; keep the queue within
        MAX_BUFFERED_OUTCOMES outcomes by dropping the oldest reports (counted)."""
        self._unsent.append(self._drain_buffers())
        total = sum(self._items(r) for r in self._unsent)
        while len(self._unsent) > 1 and total > MAX_BUFFERED_OUTCOMES:
            oldest = self._unsent.popleft()
            total -= self._items(oldest)
            self.dropped_outcomes += self._items(oldest)
        # A status-only report is worth sending once: the newest one supersedes it.
        kept = [r for r in list(self._unsent)[:-1] if self._items(r)]
        self._unsent = deque([*kept, self._unsent[-1]])

    async def _send_once(self) -> bool:
        """Send this second's report and every unsent one; True if all were acknowledged."""
        async with self._send_lock:
            self._queue_report()
            pending = list(self._unsent)
            outcomes = sum(self._items(r) for r in pending)
            try:
                response = await self._stub.ReportOutcomes(
                    iter(pending), metadata=self._metadata, timeout=REPORT_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as err:
                self._report_failures += 1
                # Loud once per outage, quiet while it lasts.
                level = logging.WARNING if self._report_failures == 1 else logging.DEBUG
                log.log(
                    level,
                    "cannot report outcomes to the controller; keeping them to resend",
                    extra={"code": err.code().name, "detail": err.details(),
                           "reports_queued": len(pending), "outcomes_queued": outcomes},
                )  # fmt: skip
                return False
            received: int = min(int(response.reports_received), len(pending))
            for _ in range(received):
                self._unsent.popleft()
            if self._report_failures:
                log.info(
                    "outcome reports delivered again",
                    extra={"failed_attempts": self._report_failures, "reports": received},
                )
                self._report_failures = 0
            return received == len(pending)

    async def _report_forever(self) -> None:
        attempt = 0
        while True:
            if await self._send_once():
                attempt = 0
                await asyncio.sleep(self._interval)
            else:
                # Retry no later than the next report would go anyway.
                delay = self._backoff.delay(attempt, self._rng.random())
                await asyncio.sleep(min(delay, self._interval))
                attempt += 1
