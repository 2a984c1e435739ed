"""``halcyon loadtest`` against real processes: what it counts as answered, successful, on time
and lost, and how its clients retry.

A gateway whose only tenant has a small quota (about a dozen requests a second) turns most of
a closed loop's calls into ``QUOTA_EXCEEDED``: the report must not call those throughput.
Honouring ``RetryInfo`` must measure the quota (few rejections per success); retrying at once
is the retry storm (many). A call to a server that is not a gateway is lost, not answered.
Given two gateways, ``--health-check readiness`` balances over both and sends nothing to one
whose readiness is NOT_SERVING (draining), where gRPC's default sticks to the first address.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

pytestmark = pytest.mark.e2e

KEY = "loadtest-small-quota"
RATE = 2000  # work tokens/s; a loadtest request costs ~70-270 (prompt + max output tokens)


def _tenants(path: Path) -> Path:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    path.write_text(
        "tenants:\n"
        "  - name: small\n"
        "    priority: critical\n"
        f"    rate: {RATE}\n"
        f"    burst: {RATE}\n"
        f"    key_sha256: [{digest}]\n"
    )
    return path


def _loadtest(target: str, *extra: str, seconds: float = 3.0) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "halcyon", "loadtest", "--target", target, "--api-key", KEY,
         "--clients", "4", "--seconds", str(seconds), "--json", *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


@pytest.fixture
def quota_fleet(launch: Any, tmp_path: Path) -> Any:
    tenants = _tenants(tmp_path / "tenants.yaml")
    return launch.fleet(
        {"replica-a": ("--intercept-ms", "0", "--ms-per-token", "0", "--jitter", "0")},
        gateway_args=("--tenants", str(tenants)),
    )


def test_quota_rejections_are_answers_not_throughput(quota_fleet: Any) -> None:
    report = _loadtest(quota_fleet.gateway.grpc)
    quota = "RESOURCE_EXHAUSTED/QUOTA_EXCEEDED"
    assert report["outcomes"][quota] > 0 and report["rejected"]["QUOTA_EXCEEDED"] > 0
    assert report["lost"] == 0 and report["retries"] == 0 and report["unfinished"] == 0
    assert report["attempts"] == report["requests"] == report["answered"]
    # Successful and on-time rates are the quota's (~2000 tokens/s ≈ a dozen requests/s,
    # plus the initial burst), far below the rate of answers.
    assert report["throughput_rps"] == report["success_rps"]
    assert report["success_rps"] < 0.5 * report["answered_rps"]
    assert report["success_rps"] * report["elapsed_s"] <= 3 * RATE * 4 / 64
    assert report["success_rate"] == pytest.approx(report["ok"] / report["requests"])
    assert report["on_time"] == report["ok"]  # no retries: every success is within its deadline
    # The timeline accounts for every attempt, second by second.
    timeline = report["timeline"]
    assert [row["t"] for row in timeline] == list(range(len(timeline)))
    assert 3 <= len(timeline) <= 5
    assert sum(row["ok"] for row in timeline) == report["ok"]
    assert (
        sum(sum(row["rejected"].values()) for row in timeline)
        == report["rejected"]["QUOTA_EXCEEDED"]
    )


def test_honouring_retry_info_measures_the_quota_and_retrying_at_once_storms(
    quota_fleet: Any,
) -> None:
    patient = _loadtest(quota_fleet.gateway.grpc, "--honor-retry-info")
    storm = _loadtest(quota_fleet.gateway.grpc, "--retry-immediately")
    for report in (patient, storm):
        assert report["lost"] == 0
        assert report["retries"] > 0
        # A request whose retry would fall after the run is cut off, not counted as ended.
        assert report["attempts"] == report["requests"] + report["retries"] + report["unfinished"]
        assert report["unfinished"] <= 4  # at most one per client
        # Retried until they succeeded: every request that ended succeeded.
        assert report["outcomes"] == {"OK": report["requests"]}
        assert report["success_rps"] * report["elapsed_s"] <= 3 * RATE * 4 / 64
    # Patient clients cost the gateway a few rejections per success; the storm, dozens.
    patient_ratio = patient["rejected"]["QUOTA_EXCEEDED"] / patient["ok"]
    storm_ratio = storm["rejected"]["QUOTA_EXCEEDED"] / storm["ok"]
    # (Four clients wake for the same refill and one wins, so a few, not one.) How many dozens
    # the storm costs depends on how fast its clients can spin: ~25 on a starved 2-core CI
    # runner under three test workers, many more on an idle one.
    assert patient_ratio < 6, patient
    assert storm_ratio > 15 and storm_ratio > 5 * patient_ratio, (patient_ratio, storm_ratio)


def test_calls_nobody_answers_as_halcyon_are_lost(quota_fleet: Any) -> None:
    # The controller serves no InferService: UNIMPLEMENTED without Halcyon's ErrorInfo.
    report = _loadtest(quota_fleet.controller.grpc, seconds=1.0)
    assert report["requests"] > 0
    assert report["lost"] == report["requests"] and report["answered"] == 0
    assert report["outcomes"] == {"UNIMPLEMENTED": report["requests"]}
    assert report["success_rps"] == report["answered_rps"] == 0.0
    assert sum(row["lost"] for row in report["timeline"]) == report["lost"]


def _infer_started(e2e: SimpleNamespace, gateway: Any) -> float:
    return float(e2e.sample(e2e.scrape(gateway), "grpc_server_started_total", grpc_method="Infer"))


def test_health_checking_clients_balance_and_leave_a_draining_gateway(
    launch: Any, e2e: SimpleNamespace
) -> None:
    # Two gateways on one fleet; the loadtest knows both addresses.
    fleet = launch.fleet({"replica-a": e2e.INSTANT})
    second = launch.gateway(fleet.controller, "--drain-delay", "30", name="gateway-b")
    second.wait_ready()
    launch.attach(fleet, second)
    gateways = (fleet.gateway, second)
    target = f"ipv4:{fleet.gateway.grpc},{second.grpc}"

    def run(*extra: str) -> tuple[dict[str, Any], list[float]]:
        before = [_infer_started(e2e, g) for g in gateways]
        proc = subprocess.run(
            [sys.executable, "-m", "halcyon", "loadtest", "--target", target, "--clients", "4",
             "--seconds", "1.5", "--json", *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout), [
            _infer_started(e2e, g) - b for g, b in zip(gateways, before, strict=True)
        ]

    # gRPC's default, pick_first: every call to the first address.
    report, calls = run()
    assert report["lost"] == 0 and calls[0] > 0 and calls[1] == 0, calls
    # round_robin over both, each SERVING on readiness.
    report, calls = run("--health-check", "readiness")
    assert report["lost"] == 0 and "round_robin" in report["mode"]
    assert min(calls) > 0.3 * sum(calls), calls
    # The second gateway drains: readiness NOT_SERVING, still serving for 30 s. Health-checking
    # clients send it nothing; it is still up and would answer.
    second.send(signal.SIGTERM)
    e2e.wait_for(
        lambda: fleet.health(second) == health_pb2.HealthCheckResponse.NOT_SERVING,
        5.0,
        "gateway-b readiness NOT_SERVING",
    )
    report, calls = run("--health-check", "readiness")
    assert report["lost"] == 0 and report["ok"] == report["requests"] > 0
    assert calls[0] > 0 and calls[1] == 0, calls
    second.check_alive()
