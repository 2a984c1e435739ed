"""Auth: the policy table, token handling, and the interceptor on a real aio server."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.auth import (
    DEV_FLEET_TOKEN,
    AuthPolicy,
    Role,
    bearer_metadata,
    token_from_env_or_default,
    token_from_metadata,
)
from common.errors import Reason, parse_rpc_error


def policy() -> AuthPolicy:
    return AuthPolicy(
        fleet_token="f",
        operator_token="o",
        rules={
            "/halcyon.v1.ControlService/": Role.OPERATOR,
            "/halcyon.v1.ControlService/WorkerSession": Role.FLEET,
            "/halcyon.v1.ControlService/GetState": None,
        },
    )


def test_full_method_beats_prefix_and_none_means_open() -> None:
    p = policy()
    assert p.required_role("/halcyon.v1.ControlService/StartRollout") is Role.OPERATOR
    assert p.required_role("/halcyon.v1.ControlService/WorkerSession") is Role.FLEET
    assert p.required_role("/halcyon.v1.ControlService/GetState") is None
    assert p.required_role("/halcyon.v1.InferService/Infer") is None  # unlisted: open


def test_health_and_reflection_are_always_open() -> None:
    p = AuthPolicy(
        fleet_token="f", operator_token="o", rules={"/grpc.health.v1.Health/": Role.FLEET}
    )
    assert p.required_role("/grpc.health.v1.Health/Check") is None
    assert p.required_role("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is None
    assert p.required_role("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo") is None


def test_check_distinguishes_missing_unknown_and_wrong_role() -> None:
    p = policy()
    method = "/halcyon.v1.ControlService/StartRollout"
    missing = p.check(method, ())
    assert missing is not None and missing.code == grpc.StatusCode.UNAUTHENTICATED
    assert missing.reason == Reason.MISSING_CREDENTIALS
    unknown = p.check(method, bearer_metadata("nope"))
    assert unknown is not None and unknown.code == grpc.StatusCode.UNAUTHENTICATED
    assert unknown.reason == Reason.INVALID_CREDENTIALS
    wrong = p.check(method, bearer_metadata("f"))
    assert wrong is not None and wrong.code == grpc.StatusCode.PERMISSION_DENIED
    assert wrong.reason == Reason.WRONG_ROLE
    assert wrong.metadata["required_role"] == "operator"
    assert p.check(method, bearer_metadata("o")) is None
    assert p.check("/halcyon.v1.ControlService/WorkerSession", bearer_metadata("f")) is None


def test_tokens_are_not_kept_in_plaintext() -> None:
    p = AuthPolicy(fleet_token="very-secret-fleet", operator_token="very-secret-op", rules={})
    assert "very-secret" not in repr(vars(p))


def test_one_token_for_both_roles_grants_both() -> None:
    p = AuthPolicy(fleet_token="same", operator_token="same", rules={})
    assert p.roles_of("same") == {Role.FLEET, Role.OPERATOR}


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((("authorization", "Bearer abc"),), "abc"),
        ((("Authorization", "bearer  abc "),), "abc"),
        ((("authorization", b"Bearer abc"),), "abc"),
        ((("authorization", "Basic abc"),), None),
        ((("authorization", "Bearer"),), None),
        ((("x-other", "Bearer abc"),), None),
        ((), None),
        (None, None),
    ],
)
def test_token_from_metadata(metadata: Any, expected: str | None) -> None:
    assert token_from_metadata(metadata) == expected


def test_token_from_env_or_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HALCYON_TEST_TOKEN", raising=False)
    assert token_from_env_or_default(None, "HALCYON_TEST_TOKEN", DEV_FLEET_TOKEN) == (
        DEV_FLEET_TOKEN,
        True,
    )
    monkeypatch.setenv("HALCYON_TEST_TOKEN", "from-env")
    assert token_from_env_or_default(None, "HALCYON_TEST_TOKEN", DEV_FLEET_TOKEN) == (
        "from-env",
        False,
    )
    assert token_from_env_or_default("flag", "HALCYON_TEST_TOKEN", DEV_FLEET_TOKEN) == (
        "flag",
        False,
    )


def test_bad_rule_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="rule key"):
        AuthPolicy(fleet_token="f", operator_token="o", rules={"halcyon.v1.X": Role.FLEET})
    with pytest.raises(ValueError):
        AuthPolicy(fleet_token="", operator_token="o", rules={})


# -- the interceptor on a real server ---------------------------------------------------------


async def _expect(call: Any, code: grpc.StatusCode, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    err = parse_rpc_error(info.value)
    assert err.code == code
    assert err.reason == reason


async def test_interceptor_rejects_every_handler_kind_before_it_runs(
    make_host: Any, echo: SimpleNamespace
) -> None:
    host = await make_host(auth=echo.policy())
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        await _expect(
            echo.unary(ch)(b"ok"), grpc.StatusCode.UNAUTHENTICATED, Reason.MISSING_CREDENTIALS
        )

        async def drain_stream() -> None:
            async for _ in echo.server_stream(ch)(b"x", metadata=bearer_metadata("bad")):
                pass

        await _expect(drain_stream(), grpc.StatusCode.UNAUTHENTICATED, Reason.INVALID_CREDENTIALS)

        async def one() -> Any:
            yield b"a"

        await _expect(
            echo.client_stream(ch)(one(), metadata=bearer_metadata(echo.operator)),
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.WRONG_ROLE,
        )

        async def drain_bidi() -> None:
            async for _ in echo.bidi(ch)(one()):
                pass

        await _expect(drain_bidi(), grpc.StatusCode.UNAUTHENTICATED, Reason.MISSING_CREDENTIALS)
        await _expect(
            echo.unary(ch, "OperatorOnly")(b"ok", metadata=bearer_metadata(echo.fleet)),
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.WRONG_ROLE,
        )
        # The right credential passes through to the handler.
        assert await echo.unary(ch)(b"ok", metadata=bearer_metadata(echo.fleet)) == b"ok"
        assert (
            await echo.unary(ch, "OperatorOnly")(b"hi", metadata=bearer_metadata(echo.operator))
            == b"hi"
        )
        assert await echo.client_stream(ch)(one(), metadata=bearer_metadata(echo.fleet)) == b"a"
        # Health needs no credential even though the host has a policy.
        health = health_pb2_grpc.HealthStub(ch)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="liveness"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
