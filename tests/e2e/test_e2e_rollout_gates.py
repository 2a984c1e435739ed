"""The rollout gates end to end (issue #20) with real processes, the real ``grpcurl`` (server
reflection only, no proto files) and the operator CLI: a rollout paused with auto-rollback off
and one awaiting approval each survive ``kill -9`` of their controller, still paused / still
waiting, and finish once resumed / approved; an analysis-only rollout walks its steps in shadow
and ends ``analyzed`` without moving traffic or making the canary stable.

Load comes from the open-loop generator ``halcyon rollout verify`` uses (a fresh session key per
request, so each arm's share of requests is its weight).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from halcyon.tools.rollout_verify import Load
from halcyon.v1 import control_pb2

pytestmark = pytest.mark.e2e

# A fast v1 and a 1.6x faster v2 (as `halcyon stack --canary` runs them).
STACK = {
    "replica-a": ("--hardware", "a10g"),
    "replica-c": ("--version", "v2", "--speed", "1.6", "--hardware", "h100"),
}
# grpcurl exits with 64 + the gRPC status code when the call fails.
FAILED_PRECONDITION_EXIT = 64 + 9
SERVICE = "halcyon.v1.ControlService"
# Short windows on little traffic: a step is judged in a few seconds.
POLICY = {"window": "1s", "min_requests": 10}


def halcyon(e2e: SimpleNamespace, *args: str, timeout_s: float = 60.0) -> Any:
    """``python -m halcyon ARGS`` with the e2e credentials in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
    env["HALCYON_OPERATOR_TOKEN"] = e2e.OPERATOR_TOKEN
    return subprocess.run(
        [sys.executable, "-m", "halcyon", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def call(fleet: Any, e2e: SimpleNamespace, method: str, body: dict[str, Any]) -> Any:
    """One ControlService call with grpcurl and the operator credential (finished process)."""
    return e2e.grpcurl(
        "-H", f"authorization: Bearer {e2e.OPERATOR_TOKEN}", "-d", json.dumps(body),
        fleet.controller.grpc, f"{SERVICE}/{method}",
    )  # fmt: skip


def ok(done: Any) -> dict[str, Any]:
    assert done.returncode == 0, (done.stdout, done.stderr)
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def refused(done: Any, reason: str) -> None:
    assert done.returncode == FAILED_PRECONDITION_EXIT, (done.stdout, done.stderr)
    assert "Code: FailedPrecondition" in done.stderr and f'"reason":"{reason}"' in done.stderr, (
        done.stderr
    )


def rollout_now(fleet: Any, e2e: SimpleNamespace, rollout_id: str) -> dict[str, Any]:
    state = ok(call(fleet, e2e, "GetState", {}))
    [found] = [r for r in state.get("rollouts", []) if r["id"] == rollout_id]
    return found  # type: ignore[no-any-return]


def decisions(fleet: Any, e2e: SimpleNamespace) -> list[dict[str, Any]]:
    listed = ok(call(fleet, e2e, "ListRolloutDecisions", {"model": e2e.MODEL, "limit": 500}))
    return list(listed.get("decisions", []))


def wait_decision(
    fleet: Any, e2e: SimpleNamespace, what: str, predicate: Any, timeout_s: float = 40.0
) -> dict[str, Any]:
    """The first stored decision matching ``predicate``; on timeout fail with the whole trail."""
    trail: list[dict[str, Any]] = []

    def probe() -> dict[str, Any] | None:
        trail[:] = decisions(fleet, e2e)
        return next((d for d in trail if predicate(d)), None)

    try:
        found: dict[str, Any] = e2e.wait_for(probe, timeout_s, what, watch=fleet.live())
    except AssertionError as exc:
        lines = [f"{d.get('action')} {d.get('reason')}: {d.get('detail')}" for d in trail]
        raise AssertionError(f"{exc}\ndecisions so far:\n" + "\n".join(lines)) from None
    return found


def load_at(fleet: Any, e2e: SimpleNamespace, rate: float = 120.0) -> Load:
    load = Load(
        argparse.Namespace(
            rate=rate, gateway=fleet.gateway.grpc, api_key=e2e.API_KEY, model=e2e.MODEL
        )
    )
    load.start()
    return load


def kill_and_restart(launch: Any, fleet: Any) -> None:
    """``kill -9`` the controller, start it again on its address and store."""
    fleet.controller.kill()
    launch.restart(fleet.controller)  # replaces fleet.controller


def test_paused_and_awaiting_approval_survive_kill_9(launch: Any, e2e: SimpleNamespace) -> None:
    fleet = launch.fleet(dict(STACK))
    model = e2e.MODEL
    target = ("--controller", fleet.controller.grpc)
    load = load_at(fleet, e2e)
    try:
        started = ok(
            call(fleet, e2e, "StartRollout", {
                "model": model, "canary_version": "v2", "step_percents": [20, 50],
                "approval": "APPROVAL_MODE_PROMOTION", "policy": POLICY,
            })
        )["rollout"]  # fmt: skip
        rollout_id = started["id"]
        assert (started["approval"], started["canary_weight_bp"]) == (
            "APPROVAL_MODE_PROMOTION",
            2000,
        )
        refused(
            call(fleet, e2e, "ApproveRollout", {"model": model}), "ROLLOUT_NOT_AWAITING_APPROVAL"
        )

        paused = ok(
            call(fleet, e2e, "PauseRollout", {"model": model, "auto_rollback": False,
                                              "reason": "change freeze"})
        )["rollout"]  # fmt: skip
        assert paused["paused"] is True and not paused.get("auto_rollback", False)
        assert paused["last_decision"]["reason"] == "paused"
        refused(call(fleet, e2e, "PauseRollout", {"model": model}), "ROLLOUT_ALREADY_PAUSED")
        # The judge keeps judging: a healthy step is held, not advanced.
        wait_decision(
            fleet, e2e, "the judge to hold a healthy step while paused",
            lambda d: d.get("reason") == "paused" and "would advance" in d.get("detail", ""),
        )  # fmt: skip
        assert rollout_now(fleet, e2e, rollout_id)["canary_weight_bp"] == 2000

        kill_and_restart(launch, fleet)
        target = ("--controller", fleet.controller.grpc)
        after = rollout_now(fleet, e2e, rollout_id)
        assert (after["state"], after["paused"], after["canary_weight_bp"]) == (
            "ROLLOUT_STATE_PROGRESSING", True, 2000,
        )  # fmt: skip
        assert after["last_decision"]["reason"] == "resumed"
        assert "still paused (auto-rollback off)" in after["last_decision"]["detail"]
        status = halcyon(e2e, "rollout", "status", model, *target)
        assert status.returncode == 0, status.stderr
        assert "paused,no-auto-rollback" in status.stdout and "approval=promotion" in status.stdout

        resumed = halcyon(e2e, "rollout", "resume", model, "--reason", "freeze over", *target)
        assert resumed.returncode == 0, resumed.stderr
        refused(call(fleet, e2e, "ResumeRollout", {"model": model}), "ROLLOUT_NOT_PAUSED")
        wait_decision(
            fleet, e2e, "the resumed rollout to advance to 50%",
            lambda d: d.get("action") == "DECISION_ACTION_ADVANCE",
        )  # fmt: skip
        waiting = wait_decision(
            fleet, e2e, "the rollout to wait for approval before promoting",
            lambda d: d.get("reason") == "awaiting_approval",
        )  # fmt: skip
        assert waiting["action"] == "DECISION_ACTION_HOLD"
        assert rollout_now(fleet, e2e, rollout_id)["awaiting_approval"] is True
        status = halcyon(e2e, "rollout", "status", model, *target)
        assert "awaiting_approval" in status.stdout, status.stdout

        kill_and_restart(launch, fleet)
        target = ("--controller", fleet.controller.grpc)
        after = rollout_now(fleet, e2e, rollout_id)
        assert (after["awaiting_approval"], after["step_index"], after["canary_weight_bp"]) == (
            True, 1, 5000,
        )  # fmt: skip
        assert "still awaiting approval" in after["last_decision"]["detail"]

        approved = halcyon(e2e, "rollout", "approve", model, "--json", *target)
        assert approved.returncode == 0, approved.stderr
        reply = json.loads(approved.stdout)
        assert (reply["decision"]["action"], reply["decision"]["reason"]) == (
            "DECISION_ACTION_PROMOTE", "approved",
        )  # fmt: skip
        assert reply["rollout"]["state"] == "ROLLOUT_STATE_PROMOTED"
    finally:
        load.stop()
    [route] = ok(call(fleet, e2e, "GetState", {}))["routing"]
    assert (route["stable_version"], route.get("canary_version", "")) == ("v2", "")

    # Watch (replayed) and history show every gate decision; the promote ends the watch.
    watched = halcyon(e2e, "rollout", "watch", model, "--replay", "500", "--until-done", *target)
    assert watched.returncode == 0, watched.stderr
    for reason in ("paused", "resumed", "awaiting_approval", "approved"):
        assert reason in watched.stdout, (reason, watched.stdout)
    reasons = [d["reason"] for d in decisions(fleet, e2e)]
    assert reasons[0] == "started" and reasons[-1] == "approved"
    assert reasons.count("resumed") >= 3  # two restarts and the operator's resume
    assert all(d.get("applied") is True for d in decisions(fleet, e2e))
    bare = e2e.grpcurl(fleet.controller.grpc, f"{SERVICE}/PauseRollout")
    assert "Code: Unauthenticated" in bare.stderr, bare.stderr


def test_an_analysis_only_rollout_never_moves_traffic(launch: Any, e2e: SimpleNamespace) -> None:
    fleet = launch.fleet(dict(STACK))
    target = ("--controller", fleet.controller.grpc)
    load = load_at(fleet, e2e)
    try:
        started = halcyon(
            e2e, "rollout", "start", e2e.MODEL, "v2", "--analysis-only", "--steps", "20,50",
            "--window", "1", "--min-requests", "10", "--json", *target,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        rollout = json.loads(started.stdout)
        assert (rollout["analysis_only"], rollout["canary_weight_bp"]) == (True, 2000)
        promote = halcyon(e2e, "rollout", "promote", e2e.MODEL, *target)
        assert promote.returncode == 1
        assert "FAILED_PRECONDITION (ROLLOUT_ANALYSIS_ONLY)" in promote.stderr
        shadow = wait_decision(
            fleet, e2e, "the judge's shadow advance",
            lambda d: d.get("action") == "DECISION_ACTION_ADVANCE",
        )  # fmt: skip
        assert shadow.get("applied", False) is False and shadow["to_percent"] == 50
        # Still at the first step's share — unless the shadow promotion has already ended the
        # dry run (1 s windows: a slow runner may see it first), which gives the share back.
        now = rollout_now(fleet, e2e, rollout["id"])
        running = now["state"] == "ROLLOUT_STATE_PROGRESSING"
        assert now.get("canary_weight_bp", 0) == (2000 if running else 0), now
        # The dry run's verdict ends the watch: 0, the judge would have promoted.
        watched = halcyon(e2e, "rollout", "watch", e2e.MODEL, "--replay", "100", "--until-done",
                          *target)  # fmt: skip
        assert watched.returncode == 0, (watched.stdout, watched.stderr)
        assert "(promote)" in watched.stdout and "analysis only, not applied" in watched.stdout
    finally:
        load.stop()
    done = rollout_now(fleet, e2e, rollout["id"])
    assert (done["state"], done.get("canary_weight_bp", 0)) == ("ROLLOUT_STATE_ANALYZED", 0)
    [route] = fleet.get_state().routing
    assert (route.stable_version, route.canary_version) == ("v1", "")
    status = halcyon(e2e, "rollout", "status", *target)
    assert "analyzed" in status.stdout and "analysis-only" in status.stdout
    [last] = fleet.control_stub.ListRolloutDecisions(
        control_pb2.ListRolloutDecisionsRequest(model=e2e.MODEL, limit=1),
        metadata=(("authorization", f"Bearer {e2e.OPERATOR_TOKEN}"),),
        timeout=5,
    ).decisions
    assert (last.action, last.applied) == (control_pb2.DECISION_ACTION_PROMOTE, False)
