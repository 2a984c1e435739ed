"""The gate RPCs over real gRPC (issue #20): PauseRollout, ResumeRollout, ApproveRollout and
StartRollout's approval / analysis_only — their statuses and ErrorInfo reasons, the operator
credential, the gate fields in GetState and every decision in List / Watch.

The servers tick once an hour, so the judge decides nothing while the assertions run; the judge's
own gate behaviour is covered on an injected clock in test_rollout_gates.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from controller_helpers import FLEET, OPERATOR, TIMEOUT, StackFactory, register, rpc_error

from common.errors import Reason
from halcyon.v1 import control_pb2

QUIET = {"rollout_tick_s": 3600.0}
FP = grpc.StatusCode.FAILED_PRECONDITION


def start(**kw: Any) -> control_pb2.StartRolloutRequest:
    return control_pb2.StartRolloutRequest(model="resnet", canary_version="v2", **kw)


async def next_decision(watch: Any) -> control_pb2.RolloutDecision:
    item = await asyncio.wait_for(watch.read(), TIMEOUT)
    assert item is not grpc.aio.EOF, "the decision stream ended"
    decision: control_pb2.RolloutDecision = item.decision
    return decision


async def test_pause_and_resume_over_grpc(start_stack: StackFactory) -> None:
    stack = await start_stack(**QUIET)
    calls = [(await register(stack, rid, version=v))[0] for rid, v in (("r1", "v1"), ("r2", "v2"))]
    stub = stack.stub
    not_running = await rpc_error(
        stub.PauseRollout(control_pb2.PauseRolloutRequest(model="resnet"), metadata=OPERATOR)
    )
    assert (not_running.code, not_running.reason) == (FP, Reason.NO_ACTIVE_ROLLOUT)
    started = (await stub.StartRollout(start(step_percents=[5, 50]), metadata=OPERATOR)).rollout
    assert (started.paused, started.auto_rollback, started.analysis_only) == (False, True, False)
    assert started.approval == control_pb2.APPROVAL_MODE_NONE
    watch = stub.WatchRolloutDecisions(
        control_pb2.WatchRolloutDecisionsRequest(model="resnet", replay=1), metadata=OPERATOR
    )
    assert (await next_decision(watch)).action == control_pb2.DECISION_ACTION_START

    paused = await stub.PauseRollout(
        control_pb2.PauseRolloutRequest(model="resnet", auto_rollback=False, reason="freeze"),
        metadata=OPERATOR,
    )
    r = paused.rollout
    assert (r.paused, r.auto_rollback, r.canary_weight_bp) == (True, False, 500)
    assert (r.last_decision.action, r.last_decision.reason) == (
        control_pb2.DECISION_ACTION_HOLD,
        "paused",
    )
    streamed = await next_decision(watch)
    assert (streamed.reason, streamed.applied) == ("paused", True)
    assert "freeze" in streamed.detail
    again = await rpc_error(
        stub.PauseRollout(control_pb2.PauseRolloutRequest(model="resnet"), metadata=OPERATOR)
    )
    assert (again.code, again.reason) == (FP, Reason.ROLLOUT_ALREADY_PAUSED)
    assert again.metadata == {"model": "resnet", "rollout_id": str(r.id)}
    assert "halcyon rollout resume resnet" in again.message
    [shown] = (await stub.GetState(control_pb2.GetStateRequest(), metadata=OPERATOR)).rollouts
    assert (shown.paused, shown.auto_rollback) == (True, False)

    resumed = await stub.ResumeRollout(
        control_pb2.ResumeRolloutRequest(model="resnet"), metadata=OPERATOR
    )
    assert (resumed.rollout.paused, resumed.rollout.auto_rollback) == (False, True)
    assert (await next_decision(watch)).reason == "resumed"
    not_paused = await rpc_error(
        stub.ResumeRollout(control_pb2.ResumeRolloutRequest(model="resnet"), metadata=OPERATOR)
    )
    assert (not_paused.code, not_paused.reason) == (FP, Reason.ROLLOUT_NOT_PAUSED)
    listed = await stub.ListRolloutDecisions(
        control_pb2.ListRolloutDecisionsRequest(model="resnet"), metadata=OPERATOR
    )
    assert [(d.reason, d.applied) for d in listed.decisions] == [
        ("started", True),
        ("paused", True),
        ("resumed", True),
    ]
    watch.cancel()
    for call in calls:
        call.cancel()


async def test_approve_and_analysis_only_over_grpc(start_stack: StackFactory) -> None:
    stack = await start_stack(**QUIET)
    calls = [(await register(stack, rid, version=v))[0] for rid, v in (("r1", "v1"), ("r2", "v2"))]
    stub = stack.stub
    bad = await rpc_error(stub.StartRollout(start(approval=9), metadata=OPERATOR))
    assert (bad.code, [v.field for v in bad.field_violations]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        ["approval"],
    )
    r = (
        await stub.StartRollout(
            start(
                step_percents=[5, 50],
                approval=control_pb2.APPROVAL_MODE_EVERY_STEP,
                analysis_only=True,
            ),
            metadata=OPERATOR,
        )
    ).rollout
    assert (r.approval, r.analysis_only, r.awaiting_approval) == (
        control_pb2.APPROVAL_MODE_EVERY_STEP,
        True,
        False,
    )
    assert "analysis only" in r.last_decision.detail
    waits_for_nothing = await rpc_error(
        stub.ApproveRollout(control_pb2.ApproveRolloutRequest(model="resnet"), metadata=OPERATOR)
    )
    assert (waits_for_nothing.code, waits_for_nothing.reason) == (
        FP,
        Reason.ROLLOUT_NOT_AWAITING_APPROVAL,
    )
    assert "not awaiting approval" in waits_for_nothing.message
    dry = await rpc_error(
        stub.PromoteRollout(control_pb2.PromoteRolloutRequest(model="resnet"), metadata=OPERATOR)
    )
    assert (dry.code, dry.reason) == (FP, Reason.ROLLOUT_ANALYSIS_ONLY)
    aborted = await stub.AbortRollout(
        control_pb2.AbortRolloutRequest(model="resnet"), metadata=OPERATOR
    )
    assert aborted.rollout.state == control_pb2.ROLLOUT_STATE_ABORTED
    for call in calls:
        call.cancel()


async def test_the_gates_need_the_operator_credential_and_a_known_model(
    start_stack: StackFactory,
) -> None:
    stack = await start_stack(**QUIET)
    stub = stack.stub
    for method, request in (
        (stub.PauseRollout, control_pb2.PauseRolloutRequest(model="resnet")),
        (stub.ResumeRollout, control_pb2.ResumeRolloutRequest(model="resnet")),
        (stub.ApproveRollout, control_pb2.ApproveRolloutRequest(model="resnet")),
    ):
        assert (await rpc_error(method(request))).code == grpc.StatusCode.UNAUTHENTICATED
        denied = await rpc_error(method(request, metadata=FLEET))
        assert denied.code == grpc.StatusCode.PERMISSION_DENIED
        none = await rpc_error(method(request, metadata=OPERATOR))
        assert (none.code, none.reason) == (FP, Reason.NO_ACTIVE_ROLLOUT)
        request.model = "bert"
        unknown = await rpc_error(method(request, metadata=OPERATOR))
        assert (unknown.code, unknown.reason) == (grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_MODEL)
        request.model = ""
        empty = await rpc_error(method(request, metadata=OPERATOR))
        assert [v.field for v in empty.field_violations] == ["model"]
    long_reason = control_pb2.PauseRolloutRequest(model="resnet", reason="x" * 2000)
    err = await rpc_error(stub.PauseRollout(long_reason, metadata=OPERATOR))
    assert [v.field for v in err.field_violations] == ["reason"]
