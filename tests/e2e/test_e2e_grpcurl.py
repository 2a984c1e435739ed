"""The real grpcurl binary against a running fleet: no proto files, only server reflection.

What an operator does by hand — list and describe the services, call Infer with JSON, probe
health, read a rich error — must work against the real processes.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

INFER = "halcyon.v1.InferService/Infer"
REQUEST = '{"model":"llama-3-8b","input":"hello","max_output_tokens":64,"timeout":"2s"}'
# grpcurl exits with 64 + the gRPC status code when the call fails.
GRPCURL_STATUS_BASE = 64
_DURATION = re.compile(r"^\d+(\.\d+)?s$")


def _seconds(text: str) -> float:
    assert _DURATION.match(text), f"not a JSON Duration: {text!r}"
    return float(text[:-1])


def test_list_shows_services_via_reflection(fleet: Any, e2e: SimpleNamespace) -> None:
    out = e2e.grpcurl(fleet.gateway.grpc, "list")
    assert out.returncode == 0, out.stderr
    services = set(out.stdout.split())
    assert {"halcyon.v1.InferService", "grpc.health.v1.Health"} <= services, services

    out = e2e.grpcurl(fleet.controller.grpc, "list")
    assert out.returncode == 0, out.stderr
    assert {"halcyon.v1.ControlService", "grpc.health.v1.Health"} <= set(out.stdout.split())


def test_describe_infer_service(fleet: Any, e2e: SimpleNamespace) -> None:
    out = e2e.grpcurl(fleet.gateway.grpc, "describe", "halcyon.v1.InferService")
    assert out.returncode == 0, out.stderr
    assert "halcyon.v1.InferService is a service" in out.stdout
    assert re.search(
        r"rpc Infer \( \.halcyon\.v1\.InferRequest \) returns \( \.halcyon\.v1\.InferResponse \)",
        out.stdout,
    ), out.stdout

    # Message types resolve through reflection too.
    out = e2e.grpcurl(fleet.gateway.grpc, "describe", "halcyon.v1.InferRequest")
    assert out.returncode == 0, out.stderr
    for name in ("model", "input", "max_output_tokens", "timeout"):
        assert re.search(rf"\b{name} = \d+;", out.stdout), (name, out.stdout)


def test_infer_returns_json_with_the_scheduler_decisions(fleet: Any, e2e: SimpleNamespace) -> None:
    out = e2e.grpcurl("-H", f"x-api-key: {e2e.API_KEY}", "-d", REQUEST, fleet.gateway.grpc, INFER)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)

    assert reply["output"].strip()
    assert reply["model"] == e2e.MODEL
    assert reply["version"] == "v1"
    assert reply["replica_id"] in fleet.workers
    assert reply["request_id"]
    assert reply["batch"]["size"] >= 1
    assert reply["batch"]["tokens"] >= 64
    assert reply["batch"]["flush_reason"] in {
        "FLUSH_REASON_DEADLINE",
        "FLUSH_REASON_FULL",
        "FLUSH_REASON_LINGER",
        "FLUSH_REASON_CAPACITY",
    }
    timings = {k: _seconds(v) for k, v in reply["timings"].items()}
    assert set(timings) == {"queued", "execution", "total"}, reply["timings"]
    assert 0 < timings["total"] < 2.0
    assert timings["queued"] <= timings["total"]
    usage = reply["usage"]
    assert 1 <= usage["output_tokens"] <= 64
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


@pytest.mark.parametrize("name", ["readiness", "liveness"])
def test_health_check(fleet: Any, e2e: SimpleNamespace, name: str) -> None:
    for proc in (fleet.gateway, fleet.controller, *fleet.workers.values()):
        out = e2e.grpcurl(
            "-d", json.dumps({"service": name}), proc.grpc, "grpc.health.v1.Health/Check"
        )
        assert out.returncode == 0, (proc.name, out.stderr)
        assert json.loads(out.stdout) == {"status": "SERVING"}, (proc.name, out.stdout)


def test_missing_api_key_is_unauthenticated(fleet: Any, e2e: SimpleNamespace) -> None:
    out = e2e.grpcurl("-d", REQUEST, fleet.gateway.grpc, INFER)
    assert out.returncode == GRPCURL_STATUS_BASE + 16, (out.stdout, out.stderr)
    assert "Code: Unauthenticated" in out.stderr, out.stderr
    assert "x-api-key" in out.stderr  # the message says how to authenticate
    assert '"reason":"MISSING_CREDENTIALS"' in out.stderr, out.stderr
    assert '"domain":"halcyon.dev"' in out.stderr


def test_invalid_request_names_the_field(fleet: Any, e2e: SimpleNamespace) -> None:
    bad = '{"model":"llama-3-8b","input":"hello","max_output_tokens":9999}'
    out = e2e.grpcurl("-H", f"x-api-key: {e2e.API_KEY}", "-d", bad, fleet.gateway.grpc, INFER)
    assert out.returncode == GRPCURL_STATUS_BASE + 3, (out.stdout, out.stderr)
    assert "Code: InvalidArgument" in out.stderr, out.stderr
    assert "max_output_tokens" in out.stderr.split("Message:", 1)[1].splitlines()[0]

    # -format-error prints the google.rpc.Status as JSON (on stderr): its details name the
    # field.
    out = e2e.grpcurl(
        "-format-error", "-H", f"x-api-key: {e2e.API_KEY}", "-d", bad, fleet.gateway.grpc, INFER
    )
    assert out.returncode == GRPCURL_STATUS_BASE + 3, (out.stdout, out.stderr)
    status = json.loads(out.stderr)
    assert status["code"] == 3
    assert "max_output_tokens" in status["message"]
    by_type = {d["@type"].rsplit("/", 1)[1]: d for d in status["details"]}
    assert by_type["google.rpc.ErrorInfo"]["reason"] == "INVALID_FIELD"
    assert by_type["google.rpc.ErrorInfo"]["domain"] == "halcyon.dev"
    violations = by_type["google.rpc.BadRequest"]["field_violations"]
    assert [v["field"] for v in violations] == ["max_output_tokens"]
    assert "4096" in violations[0]["description"]


def test_operator_reads_state_with_grpcurl(fleet: Any, e2e: SimpleNamespace) -> None:
    method = "halcyon.v1.ControlService/GetState"
    out = e2e.grpcurl(
        "-H", f"authorization: Bearer {e2e.OPERATOR_TOKEN}", fleet.controller.grpc, method
    )
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    assert {r["replica"]["replica_id"] for r in state["replicas"]} == set(fleet.workers)
    assert {"model": e2e.MODEL, "stable_version": "v1"}.items() <= state["routing"][0].items()

    # The fleet credential is not an operator credential.
    out = e2e.grpcurl(
        "-H", f"authorization: Bearer {e2e.FLEET_TOKEN}", fleet.controller.grpc, method
    )
    assert out.returncode == GRPCURL_STATUS_BASE + 7, (out.stdout, out.stderr)
    assert "Code: PermissionDenied" in out.stderr
