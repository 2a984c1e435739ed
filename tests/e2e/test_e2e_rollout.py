"""Rollouts end to end with real processes: ``halcyon rollout verify`` against a stack-shaped
fleet (a faster candidate promoted, a faulty one rolled back on error_rate, a slow one on
latency, an A/A one — the baseline's twin, 1 % of batches failing on both arms — promoted),
and a rollout that survives ``kill -9`` of its controller — the gateway keeps the weights while
the controller is gone, and the restarted controller resumes at the step it had reached and
finishes the job. The operator CLI drives the rollout and reports errors in one line.

Load comes from the same open-loop generator ``verify`` uses, with a fresh session key per
request so each arm's share of requests is its weight.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from halcyon.tools.rollout_verify import Load
from halcyon.v1 import control_pb2

# What `halcyon stack --canary` runs: a fast v1, a 0.6x straggler v1 and a 1.6x v2.
STACK = {
    "replica-a": ("--hardware", "a10g"),
    "replica-b": ("--speed", "0.6", "--hardware", "t4"),
    "replica-c": ("--version", "v2", "--speed", "1.6", "--hardware", "h100"),
}


def halcyon(e2e: SimpleNamespace, *args: str, timeout_s: float = 120.0) -> Any:
    """Run ``python -m halcyon ARGS`` with the e2e credentials in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
    env["HALCYON_FLEET_TOKEN"] = e2e.FLEET_TOKEN
    env["HALCYON_OPERATOR_TOKEN"] = e2e.OPERATOR_TOKEN
    return subprocess.run(
        [sys.executable, "-m", "halcyon", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def decisions(fleet: Any, e2e: SimpleNamespace) -> list[control_pb2.RolloutDecision]:
    reply = fleet.control_stub.ListRolloutDecisions(
        control_pb2.ListRolloutDecisionsRequest(model=e2e.MODEL),
        metadata=(("authorization", f"Bearer {e2e.OPERATOR_TOKEN}"),),
        timeout=5,
    )
    return list(reply.decisions)


def wait_for_decision(
    fleet: Any, e2e: SimpleNamespace, action: int, timeout_s: float, what: str
) -> None:
    """Wait for a decision with ``action``; on timeout fail with the whole trail."""
    trail: list[control_pb2.RolloutDecision] = []

    def probe() -> bool:
        trail[:] = decisions(fleet, e2e)
        return any(d.action == action for d in trail)

    try:
        e2e.wait_for(probe, timeout_s=timeout_s, what=what, watch=fleet.live())
    except AssertionError as exc:
        lines = [f"{d.action} {d.reason}: {d.detail}" for d in trail]
        raise AssertionError(f"{exc}\ndecisions so far:\n" + "\n".join(lines)) from None


def load_at(fleet: Any, e2e: SimpleNamespace, rate: float = 120.0) -> Load:
    load = Load(
        argparse.Namespace(
            rate=rate, gateway=fleet.gateway.grpc, api_key=e2e.API_KEY, model=e2e.MODEL
        )
    )
    load.start()
    return load


def v2_share(load: Load, seconds: float) -> float:
    """The share of answers that came from v2 over the next ``seconds``."""
    load.phase()
    time.sleep(seconds)
    seen = load.phase().ok
    return seen["v2"] / max(1, seen["v1"] + seen["v2"])


@pytest.mark.timeout(300)  # four rollouts, each judged live on per-batch evidence (~2 min)
def test_verify_ships_four_candidates_and_cleans_up(launch: Any, e2e: SimpleNamespace) -> None:
    fleet = launch.fleet(dict(STACK))
    result = halcyon(
        e2e,
        "rollout", "verify", "--json",
        "--controller", fleet.controller.grpc,
        "--gateway", fleet.gateway.grpc,
        "--state-dir", str(launch.workdir / "verify"),
        "--rate", "100",  # 20 canary requests/s at 20 %: enough per 3 s window, less CPU
        # At this rate the slow candidate's proof takes ~35-60 s at 50 % (one-second blocks
        # of latency); on a runner shared by other test workers, longer than verify's 60 s.
        "--rollout-timeout", "120",
        timeout_s=270.0,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    rows = json.loads(result.stdout)
    assert [o["candidate"] for o in rows] == ["faster", "faulty", "slow", "aa"]
    outcomes = {o["candidate"]: o for o in rows}
    assert (outcomes["faster"]["version"], outcomes["faster"]["action"]) == ("v2", "promote")
    assert (outcomes["faulty"]["action"], outcomes["faulty"]["reason"]) == (
        "rollback",
        "error_rate",
    )
    assert outcomes["slow"]["action"] == "rollback"
    assert outcomes["slow"]["reason"].startswith("latency")
    assert (outcomes["aa"]["version"], outcomes["aa"]["action"]) == ("v2-aa", "promote")
    assert outcomes["aa"]["answered_by_candidate"] > 0
    for outcome in outcomes.values():
        assert outcome["passed"]
        assert outcome["decisions"][0]["action"] == "DECISION_ACTION_START"
    # The bad candidates and the A/A one were judged against the promoted v2.
    faulty_last = outcomes["faulty"]["decisions"][-1]
    assert faulty_last["baseline"]["version"] == "v2"
    assert int(faulty_last["canary"]["errors"]) > 0
    assert outcomes["aa"]["decisions"][-1]["baseline"]["version"] == "v2"
    # The trails and the drain of the stack's own v2 went to stderr, the JSON alone to stdout.
    assert "v2-faulty" in result.stderr
    assert "drained replica-c" in result.stderr and "undrained replica-c" in result.stderr

    # Everything it started is gone, nothing is left drained, and the stack is as it found it.
    e2e.wait_for(
        lambda: fleet.replica_ids() == set(STACK),
        timeout_s=10,
        what="the verify workers to leave the fleet",
        watch=fleet.live(),
    )
    state = fleet.get_state()
    assert not [m.replica.replica_id for m in state.replicas if m.load.draining]
    [route] = state.routing
    assert (route.stable_version, route.canary_version) == ("v1", "")
    states = Counter(r.state for r in state.rollouts)
    assert states[control_pb2.ROLLOUT_STATE_PROGRESSING] == 0
    assert states[control_pb2.ROLLOUT_STATE_ROLLED_BACK] == 2
    # faster and aa on evidence; v2 given back its place after aa, then v1 (operator promotes).
    assert states[control_pb2.ROLLOUT_STATE_PROMOTED] == 4


def test_a_rollout_survives_kill_9_of_its_controller(launch: Any, e2e: SimpleNamespace) -> None:
    fleet = launch.fleet({"replica-a": STACK["replica-a"], "replica-c": STACK["replica-c"]})
    load = load_at(fleet, e2e)
    try:
        started = halcyon(
            e2e,
            "rollout", "start", e2e.MODEL, "v2", "--json",
            "--steps", "20,50,100", "--window", "2", "--min-requests", "20",
            "--controller", fleet.controller.grpc,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        rollout = json.loads(started.stdout)
        assert (rollout["canary_version"], rollout["canary_weight_bp"]) == ("v2", 2000)

        # A second rollout of the same model: one line, the reason, exit 1.
        again = halcyon(
            e2e, "rollout", "start", e2e.MODEL, "v2", "--controller", fleet.controller.grpc
        )
        assert again.returncode == 1
        [line] = again.stderr.strip().splitlines()
        assert line.startswith("halcyon rollout start: FAILED_PRECONDITION (ROLLOUT_CONFLICT)")

        wait_for_decision(
            fleet, e2e, control_pb2.DECISION_ACTION_ADVANCE, 45, "the canary to advance to 50%"
        )
        e2e.wait_for(
            lambda: v2_share(load, 0.5) > 0.35,
            timeout_s=10,
            what="the gateway to send half the sessions to v2",
            watch=fleet.live(),
        )
        fleet.controller.kill()

        # The gateway keeps the last weights it was given: about half the sessions on v2.
        assert 0.35 < v2_share(load, 1.5) < 0.65

        restarted = launch.restart(fleet.controller)  # its address and store, as a supervisor does
        state = fleet.get_state()
        [resumed] = [r for r in state.rollouts if r.id == int(rollout["id"])]
        assert (resumed.state, resumed.step_index, resumed.canary_weight_bp) == (
            control_pb2.ROLLOUT_STATE_PROGRESSING,
            1,
            5000,
        )
        assert resumed.last_decision.reason == "resumed"
        wait_for_decision(
            fleet, e2e, control_pb2.DECISION_ACTION_PROMOTE, 60, "the resumed rollout to promote"
        )
    finally:
        load.stop()
    [route] = fleet.get_state().routing
    assert (route.stable_version, route.canary_version) == ("v2", "")

    history = halcyon(e2e, "rollout", "history", e2e.MODEL, "--controller", restarted.grpc)
    assert history.returncode == 0, history.stderr
    actions = [line.split()[2] for line in history.stdout.splitlines()[1:]]
    assert actions[0] == "start" and actions[-1] == "promote"
    assert "advance" in actions
    status = halcyon(e2e, "rollout", "status", "--controller", restarted.grpc)
    assert "promoted" in status.stdout and "v2 vs v1" in status.stdout


def test_cli_errors_are_one_line_with_what_to_do(fleet: Any, e2e: SimpleNamespace) -> None:
    target = ("--controller", fleet.controller.grpc)
    cases = [
        # (argv, exit code, what the one line must say)
        (("start", e2e.MODEL, "v9", *target), 1, "FAILED_PRECONDITION (NO_CANARY_REPLICA)"),
        (("start", e2e.MODEL, "v9", "--steps", "50,20", *target), 1, "INVALID_ARGUMENT"),
        (("promote", e2e.MODEL, *target), 1, "FAILED_PRECONDITION (NO_ACTIVE_ROLLOUT)"),
        (("history", "no-such-model", *target), 1, "NOT_FOUND (UNKNOWN_MODEL)"),
        (("status", "--controller", "127.0.0.1:1", "--timeout", "1"), 1, "is a controller running"),
    ]
    for argv, code, says in cases:
        result = halcyon(e2e, "rollout", *argv)
        assert result.returncode == code, (argv, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (argv, result.stderr)
        assert "Traceback" not in result.stderr
    bad_flag = halcyon(e2e, "rollout", "start", e2e.MODEL, "v2", "--steps", "5,x")
    assert bad_flag.returncode == 2 and "5,25,50,100" in bad_flag.stderr
    # With a wrong operator token the controller says so, in one line.
    token_file = Path(fleet.controller.workdir) / "wrong-token"
    token_file.write_text("not-the-token\n")
    denied = halcyon(e2e, "rollout", "status", *target, "--operator-token-file", str(token_file))
    assert denied.returncode == 1 and "UNAUTHENTICATED" in denied.stderr
