"""The console's HTTP API against a real controller, gateway and workers (no browser).

Reads need nothing on loopback and match GetState; actions go through the servicer's own code
(the refusal is the one gRPC gives); the cookie is HttpOnly + SameSite=Strict; cross-origin and
token-less state changes are refused; events stream state and decisions; a console beyond
loopback wants the credential for every page; development mode keeps it on loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from console_support import e2e, http  # type: ignore[import-not-found]
from google.protobuf import json_format

from common.errors import parse_rpc_error
from halcyon.v1 import control_pb2

pytestmark = pytest.mark.e2e

BEARER = {"Authorization": f"Bearer {e2e.OPERATOR_TOKEN}"}


def url(stack: Any, path: str = "") -> str:
    return str(stack.controller.info["console_url"]).rstrip("/") + path


def origin(stack: Any) -> str:
    return url(stack)


def grpc_metadata() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {e2e.OPERATOR_TOKEN}"),)


def start_rollout(stack: Any) -> control_pb2.Rollout:
    reply = stack.control_stub.StartRollout(
        control_pb2.StartRolloutRequest(
            model=e2e.MODEL,
            canary_version="v2",
            step_percents=[10, 50],
            policy=control_pb2.RolloutPolicy(window=e2e.duration(60), min_requests=1000),
        ),
        metadata=grpc_metadata(),
        timeout=10,
    )
    rollout: control_pb2.Rollout = reply.rollout
    return rollout


def test_the_ready_file_names_the_console_and_state_is_getstate(stack: Any) -> None:
    assert stack.controller.info["console"] == url(stack).removeprefix("http://")
    answer = http(url(stack, "/api/state"))
    assert answer.status == 200, answer.body
    assert answer.headers["Cache-Control"] == "no-store"
    state = answer.body["state"]
    over_grpc = json_format.MessageToDict(
        stack.get_state(), always_print_fields_with_no_presence=True
    )
    assert {r["replica"]["replicaId"] for r in state["replicas"]} == stack.replica_ids()
    assert {r["replica"]["replicaId"] for r in over_grpc["replicas"]} == stack.replica_ids()
    assert state["routing"] == over_grpc["routing"]
    assert answer.body["capabilities"] == {
        "actions": ["promote", "abort", "pause", "resume", "approve", "drain", "undrain"],
        "gates": ["pause", "resume", "approve", "analysis_only"],
    }


def test_pages_carry_a_strict_policy_and_no_secret(stack: Any) -> None:
    page = http(url(stack, "/"))
    assert page.status == 200 and "<main" in page.body
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    for path in ("/", "/static/console.js", "/api/state", "/api/session"):
        text = json.dumps(http(url(stack, path)).body)
        assert e2e.OPERATOR_TOKEN not in text and e2e.FLEET_TOKEN not in text, path
    assert http(url(stack, "/static/../app.py")).status == 404
    assert http(url(stack, "/static/nope.js")).body["error"]["code"] == "NOT_FOUND"


def test_an_action_without_the_credential_or_from_another_origin_is_refused(stack: Any) -> None:
    promote = url(stack, f"/api/rollouts/{e2e.MODEL}/promote")
    bare = http(promote, "POST")
    assert (bare.status, bare.body["error"]["reason"]) == (401, "MISSING_CREDENTIALS")
    cross = http(promote, "POST", headers={"Origin": "http://evil.example", **BEARER})
    assert (cross.status, cross.body["error"]["reason"]) == (403, "CROSS_ORIGIN")
    fleet = http(promote, "POST", headers={"Authorization": f"Bearer {e2e.FLEET_TOKEN}"})
    assert (fleet.status, fleet.body["error"]["reason"]) == (403, "WRONG_ROLE")
    rebound = http(url(stack, "/api/state"), headers={"Host": "evil.example"})
    assert (rebound.status, rebound.body["error"]["reason"]) == (403, "HOST_NOT_ALLOWED")


def test_an_action_is_refused_exactly_as_the_rpc_refuses_it(stack: Any) -> None:
    # No rollout is running yet: the servicer's own FAILED_PRECONDITION / NO_ACTIVE_ROLLOUT.
    answer = http(url(stack, f"/api/rollouts/{e2e.MODEL}/promote"), "POST", headers=BEARER)
    rpc = e2e.rich_error(
        lambda: stack.control_stub.PromoteRollout(
            control_pb2.PromoteRolloutRequest(model=e2e.MODEL),
            metadata=grpc_metadata(),
            timeout=5,
        )
    )
    error = answer.body["error"]
    assert (answer.status, error["code"], error["reason"]) == (
        409,
        rpc.code.name,
        rpc.reason,
    )
    assert error["message"] == rpc.message and error["metadata"] == rpc.metadata
    unknown = http(url(stack, "/api/replicas/nobody/drain"), "POST", headers=BEARER)
    assert (unknown.status, unknown.body["error"]["reason"]) == (404, "UNKNOWN_REPLICA")
    limit = http(url(stack, f"/api/rollouts/{e2e.MODEL}/decisions?limit=0"))
    assert (limit.status, limit.body["error"]["reason"]) == (400, "INVALID_FIELD")


def test_the_session_cookie_is_httponly_strict_and_actions_need_its_csrf_token(
    stack: Any,
) -> None:
    wrong = http(url(stack, "/api/session"), "POST", body={"token": "guess"})
    assert (wrong.status, wrong.body["error"]["reason"]) == (401, "INVALID_CREDENTIALS")
    signed = http(url(stack, "/api/session"), "POST", body={"token": e2e.OPERATOR_TOKEN})
    assert signed.status == 200, signed.body
    cookie = signed.headers["Set-Cookie"]
    for flag in ("HttpOnly", "SameSite=Strict", "Path=/"):
        assert flag in cookie, cookie
    assert "Secure" not in cookie  # plain HTTP on loopback
    assert e2e.OPERATOR_TOKEN not in json.dumps(signed.body) + cookie
    session = cookie.split(";")[0]
    drain = url(stack, "/api/replicas/replica-b/drain")
    no_token = http(drain, "POST", headers={"Cookie": session, "Origin": origin(stack)})
    assert (no_token.status, no_token.body["error"]["reason"]) == (403, "CSRF_TOKEN_MISMATCH")
    no_origin = http(
        drain, "POST", headers={"Cookie": session, "X-Halcyon-CSRF": signed.body["csrf_token"]}
    )
    assert (no_origin.status, no_origin.body["error"]["reason"]) == (403, "CROSS_ORIGIN")
    ok = {"Cookie": session, "Origin": origin(stack), "X-Halcyon-CSRF": signed.body["csrf_token"]}
    drained = http(drain, "POST", headers=ok)
    assert drained.status == 200, drained.body
    assert drained.body["replica"]["replica"]["replicaId"] == "replica-b"
    assert "nextSteps" in drained.body
    undrained = http(url(stack, "/api/replicas/replica-b/undrain"), "POST", headers=ok)
    assert undrained.status == 200 and undrained.body["wasDraining"] is True
    info = http(url(stack, "/api/session"), headers={"Cookie": session})
    assert info.body["operator"] is True and info.body["csrf_token"] == signed.body["csrf_token"]
    ended = http(url(stack, "/api/session"), "DELETE", headers=ok)
    assert ended.status == 200 and ended.body["ended"] is True
    after = http(drain, "POST", headers=ok)
    assert (after.status, after.body["error"]["reason"]) == (401, "INVALID_CREDENTIALS")


class Events:
    """Reads ``/api/events`` on a thread: (event, data) pairs as they arrive."""

    def __init__(self, address: str) -> None:
        self.items: list[tuple[str, Any]] = []
        self._response = urllib.request.urlopen(address, timeout=30)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        event = ""
        try:
            for raw in self._response:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[len("event: ") :]
                elif line.startswith("data: "):
                    self.items.append((event, json.loads(line[len("data: ") :])))
        except (OSError, ValueError, AttributeError):  # closed under the reader
            return

    def close(self) -> None:
        self._response.close()


@pytest.fixture
def events(stack: Any) -> Iterator[Events]:
    reader = Events(url(stack, "/api/events"))
    try:
        yield reader
    finally:
        reader.close()


def test_events_stream_state_ticks_and_every_new_decision(stack: Any, events: Events) -> None:
    assert events._response.headers["Content-Type"].startswith("text/event-stream")
    e2e.wait_for(
        lambda: sum(1 for e, _ in events.items if e == "state") >= 2, 10, "two state events"
    )
    _, first = next(item for item in events.items if item[0] == "state")
    assert {r["replica"]["replicaId"] for r in first["state"]["replicas"]} == stack.replica_ids()
    rollout = start_rollout(stack)
    try:

        def decisions() -> list[Any]:
            mine = str(rollout.id)
            return [d for e, d in events.items if e == "decision" and d["rolloutId"] == mine]

        e2e.wait_for(decisions, 10, "the START decision as an event")
        assert decisions()[0]["action"] == "DECISION_ACTION_START"
        aborted = http(
            url(stack, f"/api/rollouts/{e2e.MODEL}/abort"),
            "POST",
            body={"reason": "testing the console"},
            headers=BEARER,
        )
        assert aborted.status == 200, aborted.body
        assert aborted.body["rollout"]["state"] == "ROLLOUT_STATE_ABORTED"
        e2e.wait_for(
            lambda: any(d["action"] == "DECISION_ACTION_ABORT" for d in decisions()),
            10,
            "the ABORT decision as an event",
        )
        [abort] = [d for d in decisions() if d["action"] == "DECISION_ACTION_ABORT"]
        assert "testing the console" in abort["detail"] + abort["reason"]
    finally:
        with contextlib.suppress(Exception):
            stack.control_stub.AbortRollout(
                control_pb2.AbortRolloutRequest(model=e2e.MODEL, reason="cleanup"),
                metadata=grpc_metadata(),
                timeout=5,
            )
    trail = http(url(stack, f"/api/rollouts/{e2e.MODEL}/decisions?limit=5"))
    assert [d["action"] for d in trail.body["decisions"]][-1] == "DECISION_ACTION_ABORT"


def test_the_gate_actions_run_the_gate_rpcs(stack: Any) -> None:
    rollout = start_rollout(stack)
    base = url(stack, f"/api/rollouts/{e2e.MODEL}")
    try:
        waiting = http(f"{base}/approve", "POST", headers=BEARER)
        assert (waiting.status, waiting.body["error"]["reason"]) == (
            409,
            "ROLLOUT_NOT_AWAITING_APPROVAL",
        )
        typo = http(f"{base}/pause", "POST", body={"auto_rollback": "no"}, headers=BEARER)
        assert (typo.status, typo.body["error"]["metadata"]["field"]) == (400, "auto_rollback")
        paused = http(f"{base}/pause", "POST", body={"auto_rollback": False}, headers=BEARER)
        assert paused.status == 200, paused.body
        shown = paused.body["rollout"]
        assert (shown["id"], shown["paused"], shown["autoRollback"]) == (
            str(rollout.id),
            True,
            False,
        )
        assert shown["lastDecision"]["reason"] == "paused"
        assert "paused from the console" in shown["lastDecision"]["detail"]
        again = http(f"{base}/pause", "POST", headers=BEARER)
        assert (again.status, again.body["error"]["reason"]) == (409, "ROLLOUT_ALREADY_PAUSED")
        [state] = [
            r
            for r in http(url(stack, "/api/state")).body["state"]["rollouts"]
            if r["id"] == str(rollout.id)
        ]
        assert (state["paused"], state["approval"]) == (True, "APPROVAL_MODE_NONE")
        resumed = http(f"{base}/resume", "POST", body={"reason": "all clear"}, headers=BEARER)
        assert resumed.status == 200 and resumed.body["rollout"]["paused"] is False
        assert "all clear" in resumed.body["rollout"]["lastDecision"]["detail"]
        not_paused = http(f"{base}/resume", "POST", headers=BEARER)
        assert (not_paused.status, not_paused.body["error"]["reason"]) == (
            409,
            "ROLLOUT_NOT_PAUSED",
        )
        assert http(f"{base}/pause", "POST").status == 401  # the credential, as for promote
    finally:
        with contextlib.suppress(Exception):
            stack.control_stub.AbortRollout(
                control_pb2.AbortRolloutRequest(model=e2e.MODEL, reason="cleanup"),
                metadata=grpc_metadata(),
                timeout=5,
            )


def test_the_traffic_history_fills_from_gateway_reports(stack: Any) -> None:
    for _ in range(20):
        stack.infer()

    def served() -> list[Any]:
        points = http(url(stack, "/api/traffic")).body["points"]
        return [p for p in points if p["models"].get(e2e.MODEL, {}).get("ok", 0) > 0]

    points = e2e.wait_for(served, 15, "the history to count the requests")
    assert sum(p["models"][e2e.MODEL]["ok"] for p in points) >= 1
    assert any(p["gateways"].get("gateway", {}).get("limit", 0) > 0 for p in points)
    loads = http(url(stack, "/api/traffic")).body["points"][-1]["load"]
    assert loads[e2e.MODEL]["slots"] >= 3
    since = points[-1]["t"]
    later = http(url(stack, f"/api/traffic?since={since}")).body["points"]
    assert later and all(p["t"] >= since for p in later)


def test_beyond_loopback_every_page_needs_the_credential(tmp_path: Any) -> None:
    launcher = e2e.Launcher(tmp_path)
    try:
        controller = launcher.controller("--console-listen", "0.0.0.0:0")
        port = controller.info["console"].rpartition(":")[2]
        base = f"http://127.0.0.1:{port}"
        refused = http(f"{base}/api/state")
        assert (refused.status, refused.body["error"]["reason"]) == (401, "MISSING_CREDENTIALS")
        assert http(f"{base}/login").status == 200
        with_bearer = http(f"{base}/api/state", headers=BEARER)
        assert with_bearer.status == 200
        signed = http(f"{base}/api/session", "POST", body={"token": e2e.OPERATOR_TOKEN})
        cookie = signed.headers["Set-Cookie"].split(";")[0]
        assert http(f"{base}/api/state", headers={"Cookie": cookie}).status == 200
        # A page (not an API) sends the browser to the sign-in page.
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            opener.open(f"{base}/", timeout=5)
            raise AssertionError("expected a redirect")
        except urllib.error.HTTPError as err:
            assert (err.code, err.headers["Location"]) == (303, "/login")
    finally:
        launcher.close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_development_mode_keeps_the_console_on_loopback(tmp_path: Any) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "halcyon", "controller", "--dev-mode", "--listen",
         "127.0.0.1:0", "--console-listen", "0.0.0.0:0", "--db", str(tmp_path / "c.sqlite")],
        capture_output=True, text=True, timeout=30, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("HALCYON_")},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "console listens on loopback only" in done.stderr
    assert time.monotonic() - started < 30


def test_a_taken_default_port_leaves_the_controller_without_a_console_but_a_given_one_fails(
    tmp_path: Any,
) -> None:
    holder = socket.socket()
    with contextlib.suppress(OSError):  # already taken by someone else: just as good
        holder.bind(("127.0.0.1", 9440))
        holder.listen()
    launcher = e2e.Launcher(tmp_path, free_console=False)
    try:
        controller = launcher.controller()  # no --console-listen: the default, 127.0.0.1:9440
        assert "console" not in controller.info
        log = controller.log_file.read_text()
        assert "console not started: its default address is taken" in log
        failed = launcher.spawn("explicit", "controller", "--db", str(tmp_path / "x.sqlite"),
                                "--console-listen", "127.0.0.1:9440")  # fmt: skip
        assert failed.wait_exit(20) == 1
        assert "cannot start serving" in failed.log_file.read_text()
    finally:
        launcher.close()
        holder.close()


ACME_KEY = "acme-console-test-key"
TENANTS_YAML = f"""
tenants:
  - name: acme
    priority: standard
    rate: 1
    burst: 64
    key_sha256: [{hashlib.sha256(ACME_KEY.encode()).hexdigest()}]
  - name: premium
    priority: critical
    rate: 2000000
    burst: 4000000
    key_sha256: [{hashlib.sha256(e2e.API_KEY.encode()).hexdigest()}]
"""


def _burst(fleet: Any, clients: int = 16, calls: int = 3) -> None:
    """Concurrent Infer calls (concurrency makes the router try the failing replica too)."""

    def client(n: int) -> None:
        for i in range(calls):
            with contextlib.suppress(grpc.RpcError):
                fleet.infer(session_key=f"burst-{n}-{i}", deadline_s=2)

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))


def test_state_shows_tenant_refusals_sheds_by_reason_and_an_open_breaker(tmp_path: Any) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS_YAML)
    launcher = e2e.Launcher(tmp_path)
    try:
        fleet = launcher.fleet(
            {"good": (), "bad": ("--fail-rate", "1")},
            controller_args=("--console-listen", "127.0.0.1:0"),
            gateway_args=("--tenants", str(tenants)),
        )
        base = str(fleet.controller.info["console_url"]).rstrip("/")

        # A tenant over its quota: every refusal the client saw is in the gateway's counts.
        refused = answered = 0
        for i in range(12):
            try:
                fleet.infer(key=ACME_KEY, session_key=f"acme-{i}", max_output_tokens=16)
                answered += 1
            except grpc.RpcError as err:
                rich = parse_rpc_error(err)
                assert (rich.code, rich.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                    "QUOTA_EXCEEDED"), rich  # fmt: skip
                refused += 1
        assert refused >= 1

        def gateway_status() -> dict[str, Any] | None:
            [gw] = http(f"{base}/api/state").body["state"]["gateways"] or [None]
            return gw  # type: ignore[no-any-return]

        def acme_counted() -> dict[str, Any] | None:
            gw = gateway_status()
            rows = {t["tenant"]: t for t in (gw or {}).get("tenants", [])}
            acme = rows.get("acme")
            return gw if acme and int(acme["requests"]) == refused + answered else None

        gw = e2e.wait_for(acme_counted, 15, "the gateway to report acme's calls")
        acme = {t["tenant"]: t for t in gw["tenants"]}["acme"]
        assert int(acme["quotaRefused"]) == refused
        assert int(acme["ok"]) == answered
        assert int(acme["admitted"]) == answered
        sheds = {s["reason"]: int(s["count"]) for s in gw["sheds"]}
        assert sheds["quota_exceeded"] == refused
        assert all(ACME_KEY not in json.dumps(t) for t in gw["tenants"])

        # The history turns the cumulative counts into per-second increases.
        def shed_in_history() -> int | None:
            points = http(f"{base}/api/traffic").body["points"]
            total = sum(p["sheds"].get("quota_exceeded", 0) for p in points)
            return total if total == refused else None

        e2e.wait_for(shed_in_history, 15, "the history to count the quota sheds")
        rates = http(f"{base}/api/traffic").body["points"]
        assert sum(p["tenants"].get("acme", {}).get("quota_refused", 0) for p in rates) == refused

        # A replica whose every batch fails: the gateway's breaker for it opens.
        def bad_open() -> dict[str, str] | None:
            _burst(fleet)
            states = {b["replicaId"]: b["state"] for b in (gateway_status() or {})["breakers"]}
            return states if states.get("bad") == "BREAKER_STATE_OPEN" else None

        states = e2e.wait_for(bad_open, 30, "an open breaker for the failing replica")
        assert states["good"] == "BREAKER_STATE_CLOSED"
    finally:
        launcher.close()
