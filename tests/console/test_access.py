"""The console's gate: reading, acting, sessions and cross-site requests (injected clock)."""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
import pytest

from common.auth import AuthPolicy
from common.clock import ManualClock
from controller.console.access import AccessPolicy, RequestFacts, host_name
from controller.console.problems import ConsoleError

FLEET = "fleet-secret"
OPERATOR = "operator-secret"
HOST = "127.0.0.1:9440"
ORIGIN = f"http://{HOST}"


def policy(*, loopback: bool = True, ttl: float = 60.0, sessions: int = 4) -> AccessPolicy:
    auth = AuthPolicy(fleet_token=FLEET, operator_token=OPERATOR)
    return AccessPolicy(
        auth, ManualClock(1000.0), loopback=loopback, session_ttl_s=ttl, max_sessions=sessions
    )


def get(**kw: Any) -> RequestFacts:
    return dataclasses.replace(RequestFacts(method="GET", host=HOST, origin=None), **kw)


def post(**kw: Any) -> RequestFacts:
    return dataclasses.replace(RequestFacts(method="POST", host=HOST, origin=ORIGIN), **kw)


def refusal(gate: AccessPolicy, facts: RequestFacts) -> tuple[grpc.StatusCode, str | None]:
    with pytest.raises(ConsoleError) as caught:
        gate.decide(facts)
    return caught.value.code, caught.value.reason


def test_loopback_reads_need_no_credential_but_actions_do() -> None:
    gate = policy()
    assert gate.decide(get()).operator is False
    assert refusal(gate, post()) == (grpc.StatusCode.UNAUTHENTICATED, "MISSING_CREDENTIALS")


def test_beyond_loopback_every_page_needs_the_credential_except_sign_in_and_assets() -> None:
    gate = policy(loopback=False)
    facts = get(host="console.example:9440")
    assert refusal(gate, facts) == (grpc.StatusCode.UNAUTHENTICATED, "MISSING_CREDENTIALS")
    assert gate.decide(dataclasses.replace(facts, public=True)).operator is False
    assert gate.decide(dataclasses.replace(facts, bearer=OPERATOR)).via == "bearer"
    session_id, _ = gate.sign_in(OPERATOR)
    assert gate.decide(dataclasses.replace(facts, session_id=session_id)).via == "session"


def test_a_loopback_console_refuses_other_host_names_dns_rebinding() -> None:
    gate = policy()
    assert refusal(gate, get(host="evil.example:9440")) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "HOST_NOT_ALLOWED",
    )
    assert refusal(gate, get(host=None))[1] == "HOST_NOT_ALLOWED"
    for host in ("localhost:9440", "[::1]:9440", "127.0.0.1"):
        assert gate.decide(get(host=host)).operator is False


def test_sign_in_checks_the_role_like_the_grpc_gate() -> None:
    gate = policy()
    for token, expected in (
        (None, (grpc.StatusCode.UNAUTHENTICATED, "MISSING_CREDENTIALS")),
        ("  ", (grpc.StatusCode.UNAUTHENTICATED, "MISSING_CREDENTIALS")),
        ("guess", (grpc.StatusCode.UNAUTHENTICATED, "INVALID_CREDENTIALS")),
        (FLEET, (grpc.StatusCode.PERMISSION_DENIED, "WRONG_ROLE")),
    ):
        with pytest.raises(ConsoleError) as caught:
            gate.sign_in(token)
        assert (caught.value.code, caught.value.reason) == expected, token
    assert len(gate) == 0


def test_a_session_acts_only_with_its_csrf_token_and_its_own_origin() -> None:
    gate = policy()
    session_id, session = gate.sign_in(OPERATOR)
    ok = post(session_id=session_id, csrf_token=session.csrf_token)
    assert gate.decide(ok).operator is True
    assert refusal(gate, dataclasses.replace(ok, csrf_token=None))[1] == "CSRF_TOKEN_MISMATCH"
    assert refusal(gate, dataclasses.replace(ok, csrf_token="x" * 43))[1] == "CSRF_TOKEN_MISMATCH"
    _, other = gate.sign_in(OPERATOR)
    # Another session's token does not do for this one.
    crossed = dataclasses.replace(ok, csrf_token=other.csrf_token)
    assert refusal(gate, crossed)[1] == "CSRF_TOKEN_MISMATCH"
    assert refusal(gate, dataclasses.replace(ok, origin=None))[1] == "CROSS_ORIGIN"


def test_a_foreign_origin_is_refused_before_anything_else() -> None:
    gate = policy()
    session_id, session = gate.sign_in(OPERATOR)
    for origin in ("http://evil.example", "http://127.0.0.1:8000", "https://127.0.0.1:9440",
                   "null"):  # fmt: skip
        for facts in (
            post(origin=origin, session_id=session_id, csrf_token=session.csrf_token),
            post(origin=origin, bearer=OPERATOR),
            post(origin=origin, public=True),  # the sign-in form too (login CSRF)
            post(origin=origin),
        ):
            assert refusal(gate, facts) == (grpc.StatusCode.PERMISSION_DENIED, "CROSS_ORIGIN")


def test_a_bearer_token_acts_without_csrf_and_is_checked_for_its_role() -> None:
    gate = policy()
    assert gate.decide(post(origin=None, bearer=OPERATOR)).operator is True
    assert refusal(gate, post(origin=None, bearer=FLEET)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "WRONG_ROLE",
    )
    assert refusal(gate, post(origin=None, bearer="nope"))[1] == "INVALID_CREDENTIALS"
    assert refusal(gate, get(bad_authorization=True))[1] == "INVALID_CREDENTIALS"


def test_sessions_expire_on_the_injected_clock() -> None:
    gate = policy(ttl=60.0)
    clock = gate._clock
    assert isinstance(clock, ManualClock)
    session_id, session = gate.sign_in(OPERATOR)
    acting = post(session_id=session_id, csrf_token=session.csrf_token)
    clock.advance(59.0)
    assert gate.decide(acting).operator is True
    clock.advance(1.0)
    assert refusal(gate, acting) == (grpc.StatusCode.UNAUTHENTICATED, "INVALID_CREDENTIALS")
    assert gate.session(session_id) is None and len(gate) == 0


def test_sign_out_ends_the_session_and_the_oldest_goes_when_full() -> None:
    gate = policy(sessions=2)
    first, _ = gate.sign_in(OPERATOR)
    second, _ = gate.sign_in(OPERATOR)
    third, _ = gate.sign_in(OPERATOR)
    assert gate.session(first) is None
    assert gate.session(second) is not None and gate.session(third) is not None
    assert gate.sign_out(second) is True and gate.sign_out(second) is False
    assert gate.session(second) is None and len(gate) == 1


def test_session_ids_are_fresh_and_kept_only_as_digests() -> None:
    gate = policy()
    ids = {gate.sign_in(OPERATOR)[0] for _ in range(3)}
    assert len(ids) == 3 and all(len(i) >= 43 for i in ids)
    held = repr(gate._sessions)
    assert not any(i in held for i in ids) and OPERATOR not in held


def test_refusals_never_repeat_a_credential() -> None:
    gate = policy()
    for facts in (post(origin=None, bearer="wrong-secret"), post(origin=None, bearer=FLEET)):
        with pytest.raises(ConsoleError) as caught:
            gate.decide(facts)
        text = caught.value.text()
        assert "wrong-secret" not in text and FLEET not in text


def test_host_name_strips_the_port() -> None:
    assert host_name("127.0.0.1:9440") == "127.0.0.1"
    assert host_name("[::1]:9440") == "::1"
    assert host_name("localhost") == "localhost"


def test_nonsense_settings_are_refused() -> None:
    auth = AuthPolicy(fleet_token=FLEET, operator_token=OPERATOR)
    with pytest.raises(ValueError):
        AccessPolicy(auth, ManualClock(), loopback=True, session_ttl_s=0)
    with pytest.raises(ValueError):
        AccessPolicy(auth, ManualClock(), loopback=True, max_sessions=0)
