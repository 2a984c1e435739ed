"""The batcher prices a batch by its longest output: one decode loop, whoever shares it.

On a decoding device (a per-step cost) growing a batch by a request of ``w`` tokens and output
budget ``o`` costs ``slope × w + step × max(0, o − longest)``: requests that fit inside the
batch's decode share its steps, and one that lengthens it pays for every extra step — which
every member waits for.
"""

from __future__ import annotations

import pytest

from common.clock import ManualClock
from gateway.batching import (
    Accepted,
    BatcherConfig,
    DeadlineBatcher,
    DropReason,
    FlushReason,
    Objective,
    OnlineCostModel,
    Rejected,
    ReplicaSlots,
)

# 10 ms per batch, 0.1 ms per token, 1 ms per decode step, known exactly (no spread).
A, B, C = 0.010, 0.0001, 0.001


def decoding_batcher(clock: ManualClock) -> DeadlineBatcher[str]:
    batcher: DeadlineBatcher[str] = DeadlineBatcher(
        clock, BatcherConfig(horizon_s=10.0, linger_s=0.005)
    )
    model = OnlineCostModel(A, B, prior_step_s=C, initial_spread=0.0)
    batcher.add_replica(ReplicaSlots("r1"), cost_model=model)
    return batcher


def test_requests_inside_the_batch_decode_share_its_steps(clock: ManualClock) -> None:
    # Two requests of 50 prompt + 100 output tokens: one decode loop of 100 steps,
    # 10 + 0.1 × 300 + 1 × 100 = 140 ms. Pricing each request's output on its own (additively,
    # 10 + 30 + 200 = 240 ms) would refuse the second one.
    batcher = decoding_batcher(clock)
    now = clock.now()
    first = batcher.submit("a", tokens=150, output_tokens=100, deadline=now + 0.2)
    second = batcher.submit("b", tokens=150, output_tokens=100, deadline=now + 0.2)
    assert isinstance(first, Accepted) and isinstance(second, Accepted)
    assert first.predicted_completion == pytest.approx(now + A + B * 150 + C * 100)
    assert second.predicted_completion == pytest.approx(now + A + B * 300 + C * 100)
    batch = batcher.take_batch("r1")
    clock.advance(0.005)  # the linger ceiling
    batch = batch or batcher.take_batch("r1")
    assert batch is not None and batch.payloads == ["a", "b"]
    assert batch.longest == 100
    assert batch.predicted_seconds == pytest.approx(A + B * 300 + C * 100)


def test_a_request_that_lengthens_the_decode_pays_every_extra_step(clock: ManualClock) -> None:
    # "a" (10 output tokens) is due in 100 ms. "x" would make its batch decode 200 steps:
    # joining would cost a 215 ms more (0.1 × 250 + 1 × 190), so x rides the next batch.
    # Priced without the step term, x costs a 25 ms more and would be put in a's batch,
    # making a miss its deadline.
    batcher = decoding_batcher(clock)
    now = clock.now()
    a = batcher.submit("a", tokens=60, output_tokens=10, deadline=now + 0.1)
    x = batcher.submit("x", tokens=250, output_tokens=200, deadline=now + 0.5)
    assert isinstance(a, Accepted) and isinstance(x, Accepted)
    alone = A + B * 60 + C * 10
    assert a.predicted_completion == pytest.approx(now + alone)
    assert x.predicted_completion == pytest.approx(now + alone + A + B * 250 + C * 200)
    batch = batcher.take_batch("r1")
    assert batch is not None
    assert batch.payloads == ["a"] and batch.reason is FlushReason.FULL
    assert batch.predicted_seconds == pytest.approx(alone)
    clock.advance(alone)
    batcher.complete(batch, alone)
    following = batcher.take_batch("r1")
    assert following is not None and following.payloads == ["x"]
    assert following.predicted_seconds == pytest.approx(A + B * 250 + C * 200)


def test_a_long_output_is_refused_when_its_decode_cannot_finish(clock: ManualClock) -> None:
    # 20 prompt + 120 output tokens, due in 100 ms: 10 + 14 ms of tokens fits, but 120 decode
    # steps do not. The refusal's parts name its own decode as the cost.
    batcher = decoding_batcher(clock)
    now = clock.now()
    batcher.submit("queued", tokens=40, output_tokens=20, deadline=now + 0.9)
    refused = batcher.submit("long", tokens=140, output_tokens=120, deadline=now + 0.1)
    assert isinstance(refused, Rejected)
    assert refused.reason is DropReason.DEADLINE_UNREACHABLE
    assert refused.parts is not None
    assert refused.parts.own == pytest.approx(A + B * 140 + C * 120)
    assert refused.predicted_completion == pytest.approx(now + refused.parts.total)


def test_the_decode_sharing_members_time_is_in_the_refusal_parts(clock: ManualClock) -> None:
    # x (output 10) would share a batch with "a" (output 150), both due at 181 ms: x's wait
    # includes a's tokens and the 140 steps by which a's decode outlasts its own. For on-time
    # tokens a is not shed for the smaller x, so x is refused.
    batcher: DeadlineBatcher[str] = DeadlineBatcher(
        clock, BatcherConfig(horizon_s=10.0, objective=Objective.ON_TIME_TOKENS)
    )
    batcher.add_replica(
        ReplicaSlots("r1"), cost_model=OnlineCostModel(A, B, prior_step_s=C, initial_spread=0)
    )
    now = clock.now()
    due = now + 0.181
    assert isinstance(batcher.submit("a", tokens=200, output_tokens=150, deadline=due), Accepted)
    refused = batcher.submit("x", tokens=20, output_tokens=10, deadline=due)
    assert isinstance(refused, Rejected)
    assert refused.parts is not None
    assert refused.parts.own == pytest.approx(A + B * 20 + C * 10)
    assert refused.parts.sharing_batch == pytest.approx(B * 200 + C * 140)
    assert refused.parts.batch_mates == 1
    assert refused.parts.total == pytest.approx(A + B * 220 + C * 150)


def test_moore_hodgson_sheds_the_request_whose_decode_costs_the_most(clock: ManualClock) -> None:
    # The same two requests for on-time requests: shedding a (150 decode steps) buys back far
    # more than x's 1 ms overrun, so a goes and x runs on its own 10-step decode.
    batcher = decoding_batcher(clock)
    now = clock.now()
    due = now + 0.181
    assert isinstance(batcher.submit("a", tokens=200, output_tokens=150, deadline=due), Accepted)
    x = batcher.submit("x", tokens=20, output_tokens=10, deadline=due)
    assert isinstance(x, Accepted)
    assert x.predicted_completion == pytest.approx(now + A + B * 20 + C * 10)
    [dropped] = batcher.take_dropped()
    assert dropped.item.payload == "a" and dropped.reason is DropReason.SHED_FOR_GOODPUT
    clock.advance(0.005)
    batch = batcher.take_batch("r1")
    assert batch is not None and batch.payloads == ["x"] and batch.longest == 10
    assert batch.predicted_seconds == pytest.approx(A + B * 20 + C * 10)


def test_completions_teach_the_step_and_the_batch_reports_its_longest(
    clock: ManualClock,
) -> None:
    batcher: DeadlineBatcher[str] = DeadlineBatcher(clock, BatcherConfig(linger_s=0.0))
    batcher.add_replica(
        ReplicaSlots("r1"), cost_model=OnlineCostModel(A, B)
    )  # a prior with no step
    for i in range(300):
        out = 16 + (i * 37) % 400
        prompt = 8 + (i * 53) % 300
        accepted = batcher.submit(
            f"r{i}", tokens=prompt + out, output_tokens=out, deadline=clock.now() + 10.0
        )
        assert isinstance(accepted, Accepted)
        batch = batcher.take_batch("r1")
        assert batch is not None and batch.longest == out
        seconds = A + B * batch.tokens + C * batch.longest
        clock.advance(seconds)
        batcher.complete(batch, seconds)
    model = batcher.cost_model("r1")
    assert model.step == pytest.approx(C, rel=0.01)
    assert model.predict(400, 200) == pytest.approx(A + B * 400 + C * 200, rel=0.002)
    assert batcher.snapshot().cost_models["r1"].step_s == model.step


def test_without_output_budgets_pricing_is_the_two_term_models(clock: ManualClock) -> None:
    # No output_tokens (the simulated bench device, old callers): step stays 0, nothing moves.
    batcher = decoding_batcher(clock)
    now = clock.now()
    accepted = batcher.submit("a", tokens=150, deadline=now + 0.2)
    assert isinstance(accepted, Accepted)
    assert accepted.predicted_completion == pytest.approx(now + A + B * 150)
    with pytest.raises(ValueError):
        batcher.submit("bad", tokens=10, output_tokens=-1, deadline=now + 1.0)
