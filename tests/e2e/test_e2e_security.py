"""Security against real processes: the enumerated method table, no default way in, a replica's
identity bound to its session, typed refusals of oversized calls, the drain delay.

Every service a server offers is enumerated with the real grpcurl through reflection (no
proto files), and every method is called without a credential and with the wrong one, so a
method no rule names — or a rule that opens a method by mistake — fails here.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from common.auth import METHOD_ACCESS, Access
from common.errors import Reason
from halcyon.v1 import control_pb2, control_pb2_grpc, infer_pb2

pytestmark = pytest.mark.e2e

GRPCURL_STATUS_BASE = 64  # grpcurl exits with 64 + the gRPC status code of a failed call
_CODE = re.compile(r"^\s*Code: (\w+)", re.M)
_REASON = re.compile(r'"reason":\s*"(\w+)"')


def _methods(e2e: SimpleNamespace, address: str) -> dict[str, str]:
    """Every method the server at ``address`` offers, as reflection lists them: full name ->
    the service's ``describe`` text for that method (streaming or not)."""
    listed = e2e.grpcurl(address, "list")
    assert listed.returncode == 0, listed.stderr
    methods: dict[str, str] = {}
    for service in listed.stdout.split():
        described = e2e.grpcurl(address, "describe", service)
        assert described.returncode == 0, described.stderr
        for m in re.finditer(r"^\s*rpc (\w+) \((.*?)\) returns \((.*?)\);", described.stdout, re.M):
            methods[f"/{service}/{m.group(1)}"] = m.group(0)
    return methods


def _call(e2e: SimpleNamespace, address: str, method: str, *headers: str) -> tuple[str, str]:
    """Call ``method`` with an empty message; (status code name, ErrorInfo reason or "")."""
    flags: list[str] = ["-max-time", "3"]
    for header in headers:
        flags += ["-H", header]
    out = e2e.grpcurl(*flags, "-d", "{}", address, method.lstrip("/"))
    if out.returncode == 0:
        return "OK", ""
    text = out.stdout + out.stderr
    code = _CODE.search(text)
    reason = _REASON.search(text)
    return (code.group(1) if code else f"exit {out.returncode}: {text}"), (
        reason.group(1) if reason else ""
    )


def test_every_method_of_every_server_is_named_and_guarded(
    fleet: Any, e2e: SimpleNamespace
) -> None:
    fleet_header = f"authorization: Bearer {e2e.FLEET_TOKEN}"
    operator_header = f"authorization: Bearer {e2e.OPERATOR_TOKEN}"
    worker = next(iter(fleet.workers.values()))
    seen: set[str] = set()
    for proc in (fleet.controller, fleet.gateway, worker):
        offered = _methods(e2e, proc.grpc)
        assert offered, proc.name
        for method, signature in offered.items():
            access = METHOD_ACCESS.get(method)
            assert access is not None, f"{proc.name} serves {method}, which no rule names"
            seen.add(method)
            if access is Access.PUBLIC:
                if "stream" in signature and "Watch" in method:
                    continue  # a health watch never ends; Check covers the service
                code, _ = _call(e2e, proc.grpc, method)
                assert code not in ("Unauthenticated", "PermissionDenied"), (method, code)
                continue
            # No credential: refused before any handler runs (Infer: by the tenant check).
            code, reason = _call(e2e, proc.grpc, method)
            assert (code, reason) == ("Unauthenticated", Reason.MISSING_CREDENTIALS), method
            # The other credential: a valid token of the wrong role.
            wrong = {
                Access.FLEET: operator_header,
                Access.OPERATOR: fleet_header,
                Access.TENANT: operator_header,
            }[access]
            code, reason = _call(e2e, proc.grpc, method, wrong)
            assert (code, reason) == ("PermissionDenied", Reason.WRONG_ROLE), (method, code)
    # The three servers together offer every method of the table.
    assert seen == set(METHOD_ACCESS), set(METHOD_ACCESS) ^ seen


def test_fleet_and_operator_tokens_sent_to_the_gateway_are_the_wrong_role(
    fleet: Any, e2e: SimpleNamespace
) -> None:
    for token in (e2e.OPERATOR_TOKEN, e2e.FLEET_TOKEN):
        err = e2e.rich_error(
            lambda token=token: fleet.infer_stub.Infer(
                infer_pb2.InferRequest(model=e2e.MODEL, input="hi"),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=5,
            )
        )
        assert err.code == grpc.StatusCode.PERMISSION_DENIED
        assert err.reason == Reason.WRONG_ROLE
        assert "tenant API key" in err.message
    err = e2e.rich_error(lambda: fleet.infer(key="not-a-key"))
    assert (err.code, err.reason) == (grpc.StatusCode.UNAUTHENTICATED, Reason.INVALID_CREDENTIALS)


def test_oversized_calls_get_typed_errors_where_the_gateway_sees_them(
    fleet: Any, e2e: SimpleNamespace
) -> None:
    # Above the valid input size: the field is named.
    err = e2e.rich_error(lambda: fleet.infer(input="x" * 70_000))
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD)
    assert [v.field for v in err.field_violations] == ["input"]
    # Above what an Infer request can be: refused unparsed, typed.
    err = e2e.rich_error(lambda: fleet.infer(input="x" * 300_000))
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.reason == Reason.MESSAGE_TOO_LARGE
    assert err.metadata["limit_bytes"] == str(128 * 1024)
    # Above gRPC's own limits (README: 4 MiB messages, 16 KiB metadata) the core refuses the
    # call before any handler sees it: RESOURCE_EXHAUSTED without ErrorInfo, as documented.
    with grpc.insecure_channel(
        fleet.gateway.grpc, options=[("grpc.max_metadata_size", 1 << 20)]
    ) as channel:
        infer = channel.unary_unary("/halcyon.v1.InferService/Infer")
        for payload, metadata in (
            (b"\x12" + b"\x80\x80\x80\x03" + b"x" * (6 << 20), (("x-api-key", e2e.API_KEY),)),
            (b"", (("x-api-key", e2e.API_KEY), ("x-padding", "p" * 20_000))),
        ):
            with pytest.raises(grpc.RpcError) as info:
                infer(payload, metadata=metadata, timeout=10)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert fleet.infer().version == "v1"  # the gateway is unharmed


def test_a_second_registration_under_a_live_replica_id_is_refused(
    launch: Any, e2e: SimpleNamespace
) -> None:
    fleet = launch.fleet(workers={"replica-a": e2e.INSTANT})
    first = fleet.workers["replica-a"]
    first_address = first.grpc
    # Another process (anyone with the fleet credential) registers under the same id.
    twin = launch.spawn(
        "twin", "worker", "--controller", fleet.controller.grpc, "--replica-id", "replica-a",
        "--reconnect-max-s", "0.5", *e2e.INSTANT,
    )  # fmt: skip
    twin.wait_ready()
    state = fleet.get_state

    e2e.wait_for(
        lambda: "is held by a live session" in twin.log_file.read_text(),
        20,
        "the twin to be refused",
        watch=(twin, first),
    )
    members = [(m.replica.replica_id, m.replica.address) for m in state().replicas]
    assert members == [("replica-a", first_address)]
    assert fleet.infer().replica_id == "replica-a"
    refused = e2e.sample(
        e2e.scrape(fleet.controller), "halcyon_controller_registrations_refused_total"
    )
    assert refused >= 1

    # Once the first session is gone (its process killed), the id is free: the twin gets it.
    first.kill()
    e2e.wait_for(
        lambda: (
            [(m.replica.replica_id, m.replica.address) for m in state().replicas]
            == [("replica-a", twin.grpc)]
        ),
        20,
        "the twin to take the free id",
        watch=(twin,),
    )
    e2e.wait_for(
        lambda: fleet.infer().replica_id == "replica-a", 20, "Infer through the twin", watch=(twin,)
    )


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in __import__("os").environ.items() if not k.startswith("HALCYON_")}
    return subprocess.run(
        [sys.executable, "-m", "halcyon", *argv, "--listen", "127.0.0.1:0",
         "--metrics-listen", "off"],
        env={**base, **(env or {})}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    try:
        return str(json.loads(lines[0])["msg"])
    except ValueError:
        return lines[0]


def test_no_default_way_in() -> None:
    tokens = {"HALCYON_FLEET_TOKEN": "f-secret", "HALCYON_OPERATOR_TOKEN": "o-secret"}
    # No credentials: every server refuses to start and says what to pass.
    for argv in (("controller", "--db", ":memory:"), ("gateway",), ("worker",)):
        message = _one_line_error(_run(*argv))
        assert "no fleet credential" in message and "--fleet-token-file PATH" in message
    message = _one_line_error(_run("controller", env={"HALCYON_FLEET_TOKEN": "f-secret"}))
    assert "no operator credential" in message
    # A gateway without tenants refuses too (the demo tenants are for development mode).
    message = _one_line_error(_run("gateway", env=tokens))
    assert "no --tenants" in message and "--dev-mode" in message
    # The public dev token is refused outside development mode ...
    message = _one_line_error(_run("worker", env={"HALCYON_FLEET_TOKEN": "dev-fleet-token"}))
    assert "public development token" in message
    # ... and development mode is refused on an address other machines can reach.
    out = subprocess.run(
        [sys.executable, "-m", "halcyon", "gateway", "--dev-mode", "--listen", "0.0.0.0:0",
         "--metrics-listen", "off"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "loopback only" in _one_line_error(out)
    # A secret on the command line is refused by argparse, with where to put it instead.
    out = _run("controller", "--fleet-token", "f-secret", env=tokens)
    assert out.returncode == 2 and "--fleet-token-file PATH" in out.stderr


def test_drain_delay_keeps_serving_with_readiness_off_then_stops(
    launch: Any, e2e: SimpleNamespace
) -> None:
    fleet = launch.fleet(gateway_args=("--drain-delay", "1.5"))
    gateway = fleet.gateway
    gateway.send(signal.SIGTERM)
    sent = time.monotonic()
    e2e.wait_for(
        lambda: fleet.health(gateway) == health_pb2.HealthCheckResponse.NOT_SERVING,
        1.0,
        "readiness NOT_SERVING at once",
    )
    assert fleet.health(gateway, "liveness") == health_pb2.HealthCheckResponse.SERVING
    served = 0
    while time.monotonic() - sent < 1.0:  # inside the delay: still answering
        assert fleet.infer().version == "v1"
        served += 1
    assert served > 0
    assert gateway.wait_exit(10) == 0
    assert time.monotonic() - sent >= 1.5


def test_a_second_sigterm_cuts_the_drain_delay(launch: Any, e2e: SimpleNamespace) -> None:
    controller = launch.controller("--drain-delay", "60", "--shutdown-grace", "60")
    stub = control_pb2_grpc.ControlServiceStub(grpc.insecure_channel(controller.grpc))
    stub.GetState(
        control_pb2.GetStateRequest(),
        metadata=(("authorization", f"Bearer {e2e.OPERATOR_TOKEN}"),),
        timeout=5,
    )
    controller.send(signal.SIGTERM)
    time.sleep(0.3)
    assert controller.alive  # in its 60 s drain delay
    started = time.monotonic()
    controller.send(signal.SIGTERM)
    assert controller.wait_exit(10) == 0
    assert time.monotonic() - started < 5.0
