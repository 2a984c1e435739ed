"""One request's failure costs only that request; a frozen replica costs one attempt timeout
(ADR 0011). The dispatcher runs against scripted worker calls and a manual clock: every call's
outcome and every timer is driven by the test, nothing sleeps."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from common.clock import ManualClock
from common.cost_samples import CostSampleValue
from common.rng import SeededRng
from gateway.batching import BatcherConfig, DeadlineBatcher
from gateway.dispatcher import PendingRequest, VersionDispatcher
from gateway.replicas import ReplicaInfo, Replicas
from gateway.routing import AttemptConfig, AttemptPolicy, BreakerState, HedgePolicy, PeakEwmaRouter
from gateway.validation import ValidRequest
from halcyon.v1 import worker_pb2

ATTEMPTS = AttemptPolicy(AttemptConfig(timeout_multiplier=4.0, min_timeout_s=0.25))


@dataclass
class Call:
    replica_id: str
    request: worker_pb2.ExecuteBatchRequest
    timeout: float
    future: asyncio.Future[worker_pb2.ExecuteBatchResponse]

    @property
    def ids(self) -> list[str]:
        return [item.id for item in self.request.items]

    def succeed(self) -> None:
        self.future.set_result(
            worker_pb2.ExecuteBatchResponse(
                results=[
                    worker_pb2.ItemResult(id=i, output=f"out-{i}", output_tokens=1)
                    for i in self.ids
                ]
            )
        )

    def fail(self, code: grpc.StatusCode, details: str = "boom") -> None:
        md = grpc.aio.Metadata()
        self.future.set_exception(grpc.aio.AioRpcError(code, md, md, details))


@dataclass
class ScriptedPool:
    """Stands in for WorkerPool: every ExecuteBatch is recorded and answered by the test."""

    calls: list[Call] = field(default_factory=list)

    def stub(self, replica_id: str) -> Any:
        pool = self

        class Stub:
            def ExecuteBatch(
                self, request: worker_pb2.ExecuteBatchRequest, *, timeout: float, metadata: Any
            ) -> asyncio.Future[worker_pb2.ExecuteBatchResponse]:
                future = asyncio.get_running_loop().create_future()
                pool.calls.append(Call(replica_id, request, timeout, future))
                return future

        return Stub()

    def pending(self) -> list[Call]:
        return [c for c in self.calls if not c.future.done()]


@dataclass
class Harness:
    clock: ManualClock
    pool: ScriptedPool
    dispatcher: VersionDispatcher
    members: Replicas
    requests: dict[str, PendingRequest] = field(default_factory=dict)

    def join(self, rid: str, warmup: tuple[CostSampleValue, ...] = ()) -> None:
        """The replica joins (or is listed again) through the membership owner."""
        self.members.insert(
            ReplicaInfo(
                rid,
                f"{rid}:1",
                model="m",
                version="v1",
                hardware="",
                slots=1,
                speed=1.0,
                draining=False,
                warmup=warmup,
            )
        )

    def submit(self, name: str, timeout_s: float = 2.0, tokens: int = 10) -> PendingRequest:
        now = self.clock.now()
        pending = PendingRequest(
            request_id=name,
            valid=ValidRequest("m", "hi", 1, tokens - 1, "", 0, False, timeout_s),
            received_at=now,
            deadline=now + timeout_s,
        )
        self.requests[name] = pending
        self.dispatcher.submit(pending)
        return pending

    async def settle(self) -> None:
        """Let the loop run the callbacks that are due now (no time passes)."""
        for _ in range(5):
            await asyncio.sleep(0)


async def harness(replicas: tuple[str, ...] = ("a", "b")) -> Harness:
    clock = ManualClock(1000.0)
    pool = ScriptedPool()
    dispatcher = VersionDispatcher(
        "m",
        "v1",
        clock=clock,
        batcher=DeadlineBatcher(clock, BatcherConfig(linger_s=0.0)),
        router=PeakEwmaRouter(SeededRng(3)),
        hedging=HedgePolicy(clock),
        pool=pool,  # type: ignore[arg-type]
        fleet_metadata=(),
        on_batch=lambda *_: None,
        on_flush=lambda _reason: None,
        on_hedge=lambda _result: None,
        on_busy=lambda: None,
        attempts=ATTEMPTS,
    )
    dispatcher.start()
    members = Replicas()
    members.subscribe(dispatcher.changed)
    h = Harness(clock, pool, dispatcher, members)
    for rid in replicas:
        h.join(rid)
    return h


async def warm_up(h: Harness, rounds: int = 3) -> None:
    """Complete a few batches on every replica so each cost model has learned something."""
    for r in range(rounds):
        for rid in h.dispatcher.replicas:
            h.submit(f"warm-{rid}-{r}")
        await h.settle()
        h.clock.advance(0.02)
        for call in h.pool.pending():
            call.succeed()
        await h.settle()


async def test_a_poison_request_costs_only_itself() -> None:
    """The request whose batch failed on "a" waits for "b"; "a" keeps serving everyone else
    (before, "a" was excluded from every batch while that retry was queued)."""
    h = await harness()
    await warm_up(h)
    poison = h.submit("poison", timeout_s=600.0)
    await h.settle()
    [first] = h.pool.pending()
    occupied = "b" if first.replica_id == "a" else "a"
    h.submit("keep-busy")  # occupies the other replica so the poison's retry must wait
    await h.settle()
    [busy] = [c for c in h.pool.pending() if c.replica_id == occupied]
    first.fail(grpc.StatusCode.INTERNAL)
    await h.settle()
    assert poison.avoid == {first.replica_id} and not poison.answered

    # While the poison waits for the other replica, the failed one serves everyone else.
    served_there = []
    for i in range(5):
        h.submit(f"other-{i}")
        await h.settle()
        for call in h.pool.pending():
            if call.replica_id == first.replica_id:
                assert "poison" not in call.ids
                served_there += call.ids
                h.clock.advance(0.01)
                call.succeed()
        await h.settle()
    assert served_there == [f"other-{i}" for i in range(5)]
    assert all(h.requests[f"other-{i}"].result is not None for i in range(5))

    # When the other replica frees, the poison gets its second attempt there.
    busy.succeed()
    await h.settle()
    [retry] = h.pool.pending()
    assert retry.replica_id == occupied and "poison" in retry.ids
    retry.succeed()
    await h.settle()
    assert poison.result is not None and poison.result.replica_id == occupied


async def test_the_call_timeout_follows_the_prediction_not_a_long_deadline() -> None:
    h = await harness(("a",))
    await warm_up(h)
    h.submit("patient", timeout_s=600.0)
    await h.settle()
    [call] = h.pool.pending()
    model = h.dispatcher.cost_model("a")
    assert model is not None and model.observations > 0
    assert call.timeout == pytest.approx(ATTEMPTS.config.min_timeout_s)  # not ~600 s
    assert math.isfinite(call.timeout)


async def test_a_replica_with_nothing_learned_or_measured_may_answer_until_the_answer_by() -> None:
    """A worker without warm-up, before it answered once: no constant may time it out (a
    device whose batches take 30 s would never be served) — the call runs until its request
    must be answered, and what it then answers teaches the model."""
    h = await harness(("a",))
    first = h.submit("first", timeout_s=60.0)
    await h.settle()
    [call] = h.pool.pending()
    assert call.timeout == pytest.approx(first.answer_by - h.clock.now())
    assert call.timeout > 59.0
    h.clock.advance(30.0)
    call.succeed()
    await h.settle()
    assert first.result is not None
    h.submit("second", timeout_s=600.0)
    await h.settle()
    [second] = h.pool.pending()
    # From what it learned (30 s, against a prior of milliseconds): time for another 30 s
    # batch, and not the 600 s deadline.
    assert 30.0 < second.timeout < 300.0


async def test_a_frozen_replica_costs_one_attempt_timeout_then_the_retry_goes_elsewhere() -> None:
    h = await harness()
    await warm_up(h)
    req = h.submit("r", timeout_s=2.0)
    await h.settle()
    [frozen] = h.pool.pending()
    h.clock.advance(frozen.timeout)
    frozen.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")  # the call's own timeout
    await h.settle()
    [retry] = h.pool.pending()
    assert retry.replica_id != frozen.replica_id and retry.ids == ["r"]
    # The timeout was evidence: a latency lower bound at once, and one more opens the breaker.
    view = {v.replica_id: v for v in h.dispatcher.router.views(h.clock.now())}[frozen.replica_id]
    assert view.latency_estimate_s >= frozen.timeout
    assert view.breaker is BreakerState.CLOSED
    retry.succeed()
    await h.settle()
    assert req.result is not None and req.result.replica_id == retry.replica_id


async def test_two_timeouts_in_a_row_open_the_breaker_and_the_cost_model_survives() -> None:
    h = await harness(("a",))
    await warm_up(h)
    req = h.submit("r", timeout_s=5.0)
    for _ in range(2):  # the only replica: the retry goes where it failed
        await h.settle()
        [call] = h.pool.pending()
        h.clock.advance(call.timeout)
        call.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    await h.settle()
    assert req.error is not None  # two attempts, both timed out: a typed answer
    assert getattr(req.error, "code", None) is grpc.StatusCode.UNAVAILABLE
    assert getattr(req.error, "reason", None) == "UPSTREAM_FAILURE"
    [view] = h.dispatcher.router.views(h.clock.now())
    assert view.breaker is BreakerState.OPEN
    model = h.dispatcher.cost_model("a")  # kept while the breaker is open: never "unknown"
    assert model is not None and model.observations == 3
    assert math.isfinite(model.intercept) and math.isfinite(model.slope)


async def test_a_request_waiting_on_a_frozen_replica_is_answered_before_its_deadline() -> None:
    h = await harness(("a",))
    await warm_up(h)
    urgent = h.submit("urgent", timeout_s=0.12)
    await h.settle()
    [call] = h.pool.pending()
    assert call.timeout <= 0.12  # cut at the request's answer-by, not the attempt timeout
    assert not urgent.answered
    h.clock.advance(urgent.answer_by - h.clock.now())
    h.dispatcher._give_up(h.dispatcher._flights[next(iter(h.dispatcher._flights))])
    assert urgent.answered and urgent.error is not None
    err = urgent.error
    assert getattr(err, "code", None) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert getattr(err, "reason", None) == "DEADLINE_MISSED"
    assert h.clock.now() < urgent.deadline  # the answer left before the client's deadline
    # The call ends by its own timeout, cut short by the deadline: no verdict on the replica.
    call.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    await h.settle()
    [view] = h.dispatcher.router.views(h.clock.now())
    assert view.breaker is BreakerState.CLOSED and view.inflight == 0


async def test_mixed_deadlines_in_one_batch_are_answered_each_in_time() -> None:
    h = await harness(("a",))
    await warm_up(h)
    h.submit("blocker", timeout_s=5.0)  # keeps "a" busy so the next two share a batch
    await h.settle()
    [blocker] = h.pool.pending()
    short = h.submit("short", timeout_s=0.15)
    long = h.submit("long", timeout_s=5.0)
    h.clock.advance(0.01)
    blocker.succeed()
    await h.settle()
    [call] = h.pool.pending()
    assert set(call.ids) == {"short", "long"}
    flight = next(iter(h.dispatcher._flights.values()))
    assert flight.give_up_timer is not None  # "short" must be answered before the call ends
    h.clock.advance(short.answer_by - h.clock.now())
    h.dispatcher._give_up(flight)
    assert short.answered and not long.answered
    h.clock.advance(0.01)
    call.succeed()
    await h.settle()
    assert long.result is not None and short.result is None


# -- a replica's warm-up, and what calls out of time prove -----------------------------------

SLOW_WARMUP = (
    CostSampleValue(items=1, batch_tokens=16, longest_output_tokens=8, seconds=5.0),
    CostSampleValue(items=4, batch_tokens=512, longest_output_tokens=112, seconds=5.0),
)


async def test_a_replica_joining_with_its_warm_up_has_a_prediction_for_its_first_batch() -> None:
    """A 5 s device: its first attempt is timed from the measured 5 s (not a constant that
    times it out, nor the requests' 90 s deadline), the router's prior is 5 s, and a
    re-upsert of the known replica does not teach its model the warm-up again."""
    h = await harness(())
    h.join("slow", warmup=SLOW_WARMUP)
    model = h.dispatcher.cost_model("slow")
    assert model is not None and model.observations == 2
    assert model.predict(16) == pytest.approx(5.0, rel=0.02)
    [view] = h.dispatcher.router.views(h.clock.now())
    assert view.latency_estimate_s == pytest.approx(5.0)
    req = h.submit("first", timeout_s=90.0, tokens=64)
    await h.settle()
    [call] = h.pool.pending()
    assert 4.0 * 5.0 <= call.timeout <= 4.0 * 5.0 * 1.5  # 4 x the conservative prediction
    h.clock.advance(5.0)
    call.succeed()
    await h.settle()
    assert req.result is not None
    seen = model.observations
    h.join("slow", warmup=SLOW_WARMUP)
    assert h.dispatcher.cost_model("slow") is model and model.observations == seen


async def test_a_timed_out_attempt_proves_a_floor_and_the_next_attempt_waits_longer() -> None:
    """A replica 20x slower than it measured: the first attempt times out and proves the
    batch costs more than it waited; the retry (on the same replica: the only one) is given
    more than that, answers, and the model learns from the answer."""
    fast = (
        CostSampleValue(items=1, batch_tokens=10, longest_output_tokens=1, seconds=0.2),
        CostSampleValue(items=1, batch_tokens=20, longest_output_tokens=1, seconds=0.2),
    )
    h = await harness(())
    h.join("a", warmup=fast)
    req = h.submit("r", timeout_s=60.0)
    await h.settle()
    [first] = h.pool.pending()
    assert first.timeout < 4.0  # from the (wrong) 0.2 s measurement
    h.clock.advance(first.timeout)
    first.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    await h.settle()
    [second] = h.pool.pending()
    assert second.timeout >= 2.0 * first.timeout  # twice what the first proved
    model = h.dispatcher.cost_model("a")
    assert model is not None and model.observations == 2  # a censored time is not a sample
    h.clock.advance(4.0)
    second.succeed()
    await h.settle()
    assert req.result is not None and model.observations == 3
    # "More than the first attempt waited" still holds after a 4 s answer: kept.
    h.submit("next", timeout_s=60.0)
    await h.settle()
    [third] = h.pool.pending()
    assert third.timeout >= 2.0 * first.timeout


async def test_a_call_cut_at_the_deadline_is_no_verdict_but_still_a_floor() -> None:
    h = await harness(("a",))
    await warm_up(h)
    tight = h.submit("tight", timeout_s=0.2)
    await h.settle()
    [call] = h.pool.pending()
    h.clock.advance(call.timeout)
    call.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    await h.settle()
    # Its answer was due: answered now, typed, rather than retried into a bare client-side
    # DEADLINE_EXCEEDED.
    assert getattr(tight.error, "reason", None) == "DEADLINE_MISSED"
    assert not h.pool.pending()
    [view] = h.dispatcher.router.views(h.clock.now())
    assert view.breaker is BreakerState.CLOSED
    assert h.dispatcher._proven("a", 10) == pytest.approx(call.timeout)
    assert h.dispatcher._proven("a", 5) == 0.0  # a smaller batch may be cheaper


async def test_a_half_open_probe_gets_twice_what_the_timeouts_proved_not_the_deadline() -> None:
    """A frozen replica's probe costs its batch one bounded wait (twice what the timeouts that
    opened the breaker proved), not its requests' whole 60 s deadline."""
    h = await harness(("a",))
    await warm_up(h)
    waits = []
    h.submit("r", timeout_s=60.0)
    for _ in range(2):  # it and its retry time out: two in a row open the breaker
        await h.settle()
        [call] = h.pool.pending()
        waits.append(call.timeout)
        h.clock.advance(call.timeout)
        call.fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    await h.settle()
    assert waits[1] == pytest.approx(2.0 * waits[0])  # the retry: twice what the first proved
    [view] = h.dispatcher.router.views(h.clock.now())
    assert view.breaker is BreakerState.OPEN
    h.clock.advance(60.0)  # past the re-open backoff: half-open
    h.submit("probe", timeout_s=60.0)
    await h.settle()
    [probe] = h.pool.pending()
    proven = h.dispatcher._proven("a", 10)
    assert proven >= waits[0]
    assert probe.timeout == pytest.approx(2.0 * proven)
    assert probe.timeout < 30.0
