"""Auth: the fail-closed method table, token handling, and the interceptor on a real aio server."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.descriptor import FileDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from common.auth import (
    METHOD_ACCESS,
    Access,
    AuthPolicy,
    Role,
    bearer_metadata,
    token_from_metadata,
)
from common.errors import Reason, parse_rpc_error
from common.serving import ServiceHost, ServingOptions
from halcyon.v1 import control_pb2, control_pb2_grpc, infer_pb2, worker_pb2

CONTROL = "/halcyon.v1.ControlService/"


def policy() -> AuthPolicy:
    return AuthPolicy(fleet_token="f", operator_token="o")


def _served_methods(*files: FileDescriptor) -> set[str]:
    return {
        f"/{service.full_name}/{method.name}"
        for file in files
        for service in file.services_by_name.values()
        for method in service.methods
    }


SERVED = _served_methods(
    control_pb2.DESCRIPTOR,
    worker_pb2.DESCRIPTOR,
    infer_pb2.DESCRIPTOR,
    health_pb2.DESCRIPTOR,
    reflection_pb2.DESCRIPTOR,
)


def test_the_method_table_names_every_method_of_every_service_and_nothing_else() -> None:
    # Enumerated from the descriptors, so a method added to a .proto fails here until someone
    # decides who may call it.
    assert len(SERVED) == 23
    assert sorted(SERVED - set(METHOD_ACCESS)) == []
    assert sorted(set(METHOD_ACCESS) - SERVED) == []


def test_who_may_call_what() -> None:
    by_access: dict[Access, set[str]] = {}
    for method, access in METHOD_ACCESS.items():
        by_access.setdefault(access, set()).add(method.rsplit("/", 1)[1])
    assert by_access == {
        Access.PUBLIC: {"Check", "Watch", "List", "ServerReflectionInfo"},
        Access.TENANT: {"Infer"},
        Access.FLEET: {
            "WorkerSession", "WatchFleet", "ReportOutcomes", "ExecuteBatch", "Drain", "Undrain",
            "Describe",
        },
        Access.OPERATOR: {
            "GetState", "StartRollout", "PromoteRollout", "AbortRollout", "PauseRollout",
            "ResumeRollout", "ApproveRollout", "ListRolloutDecisions",
            "WatchRolloutDecisions", "DrainReplica", "UndrainReplica",
        },
    }  # fmt: skip


def test_unlisted_methods_are_refused_not_opened() -> None:
    p = policy()
    method = f"{CONTROL}SomethingNew"
    assert p.required(method) is None
    assert p.unlisted([method, f"{CONTROL}GetState"]) == [method]
    for metadata in ((), bearer_metadata("o"), bearer_metadata("f")):
        err = p.check(method, metadata)
        assert err is not None and err.code == grpc.StatusCode.PERMISSION_DENIED
        assert err.reason == Reason.UNLISTED_METHOD


def test_public_and_tenant_methods_pass_the_gate_without_a_token() -> None:
    p = policy()
    assert p.check("/grpc.health.v1.Health/Check", ()) is None
    assert p.check("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", ()) is None
    # Infer's tenant key is checked by the gateway's servicer, which knows the tenants.
    assert p.check("/halcyon.v1.InferService/Infer", ()) is None


def test_health_and_reflection_are_public_even_under_custom_rules() -> None:
    p = AuthPolicy(fleet_token="f", operator_token="o", rules={"/a.S/M": Role.FLEET})
    assert p.required("/grpc.health.v1.Health/Check") is Access.PUBLIC
    assert p.required(f"{CONTROL}GetState") is None  # not in these rules: refused


def test_check_distinguishes_missing_unknown_and_wrong_role() -> None:
    p = policy()
    method = f"{CONTROL}StartRollout"
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
    assert p.check(f"{CONTROL}WorkerSession", bearer_metadata("f")) is None


def test_an_unconfigured_credential_grants_nothing() -> None:
    p = AuthPolicy(fleet_token="f", operator_token=None)
    assert p.roles_of("f") == {Role.FLEET}
    err = p.check(f"{CONTROL}GetState", bearer_metadata("anything"))
    assert err is not None and err.reason == Reason.INVALID_CREDENTIALS


def test_tokens_are_not_kept_in_plaintext() -> None:
    p = AuthPolicy(fleet_token="very-secret-fleet", operator_token="very-secret-op")
    assert "very-secret" not in repr(vars(p))


def test_one_token_for_both_roles_is_refused() -> None:
    with pytest.raises(ValueError, match="differ"):
        AuthPolicy(fleet_token="same", operator_token="same")


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


def test_bad_rules_and_tokens_are_refused() -> None:
    with pytest.raises(ValueError, match="full method name"):
        AuthPolicy(fleet_token="f", operator_token="o", rules={"/halcyon.v1.X/": Role.FLEET})
    with pytest.raises(ValueError, match="full method name"):
        AuthPolicy(fleet_token="f", operator_token="o", rules={"halcyon.v1.X": Role.FLEET})
    with pytest.raises(ValueError, match="empty"):
        AuthPolicy(fleet_token=" ", operator_token="o")


async def test_a_host_refuses_a_service_with_unnamed_methods() -> None:
    rules = {f"{CONTROL}GetState": Role.OPERATOR}  # nine ControlService methods left unnamed
    host = ServiceHost(
        "test",
        ServingOptions(metrics_listen=None),
        AuthPolicy(fleet_token="f", operator_token="o", rules=rules),
    )
    with pytest.raises(ValueError, match=r"no authorization rule for .*WorkerSession"):
        host.add_service(
            control_pb2_grpc.add_ControlServiceServicer_to_server,
            control_pb2_grpc.ControlServiceServicer(),
            "halcyon.v1.ControlService",
        )


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


async def test_a_served_method_without_a_rule_is_refused_on_the_wire(
    make_host: Any, echo: SimpleNamespace
) -> None:
    # Only Unary is named: the echo service's other methods have handlers but no rule.
    host = await make_host(
        auth=AuthPolicy(
            fleet_token=echo.fleet,
            operator_token=echo.operator,
            rules={f"/{echo.service}/Unary": Role.FLEET},
        )
    )
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        assert await echo.unary(ch)(b"ok", metadata=bearer_metadata(echo.fleet)) == b"ok"
        await _expect(
            echo.unary(ch, "OperatorOnly")(b"ok", metadata=bearer_metadata(echo.operator)),
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.UNLISTED_METHOD,
        )
