"""The published clients against a real stack: what a user running them sees.

``clients/python/infer_client.py`` and ``clients/node/infer.js`` run as subprocesses, as a user
runs them, against a controller, a worker and a gateway started on 127.0.0.1:0. Each must print
the answer on success, and on a rejection the typed reason, the field it names and the retry
advice read from the ``google.rpc.Status`` trailer. One stack without workers shows the service
config at work on the real gateway: its refusals are retried as many times as the config allows
(so the gateway's errors reach the client before any header commits the call), and the client
still gets the last attempt's rich error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clients_support import CLIENTS, e2e, retry_policy  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

PYTHON_CLIENT = CLIENTS / "python" / "infer_client.py"
MAX_ATTEMPTS = retry_policy()["maxAttempts"]
RUN_TIMEOUT_S = 60


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    # From outside the repository, as a user's script would run: nothing found by accident.
    return subprocess.run(
        argv, cwd=Path("/"), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, str(PYTHON_CLIENT), *args])


def _lines(out: subprocess.CompletedProcess[str]) -> list[str]:
    return out.stdout.strip().splitlines()


def _attempts_refused(gateway: Any) -> int:
    """How many Infer attempts the gateway refused NO_CAPACITY. Called after the client exited,
    so every attempt was answered, and counted before its answer (counters flush on scrape)."""

    def refused() -> float:
        families = e2e.scrape(gateway)
        return float(e2e.sample(families, "halcyon_gateway_requests_total", outcome="no_capacity"))

    return int(e2e.wait_for(refused, 10, "the refusals counted", watch=(gateway,)))


# -- Python -------------------------------------------------------------------------------------


def test_python_client_prints_the_answer(stack: Any) -> None:
    out = _python(stack.gateway.grpc)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert out.stdout.strip(), "no output printed"
    assert not out.stdout.startswith(("INVALID", "UNAVAILABLE")), out.stdout


def test_python_client_prints_the_reason_of_an_invalid_request(stack: Any) -> None:
    out = _python(stack.gateway.grpc, e2e.API_KEY, "9999")
    assert out.returncode == 1, (out.stdout, out.stderr)
    first, *details = _lines(out)
    assert first.startswith("INVALID_ARGUMENT: "), out.stdout
    assert "max_output_tokens" in first
    assert "reason: INVALID_FIELD {'field': 'max_output_tokens'}" in details, out.stdout
    assert not any(line.startswith("retry after") for line in details), out.stdout


def test_python_client_names_a_missing_credential(stack: Any) -> None:
    out = _python(stack.gateway.grpc, "not-a-key")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert _lines(out)[0].startswith("UNAUTHENTICATED: "), out.stdout
    assert "reason: INVALID_CREDENTIALS {}" in _lines(out), out.stdout


def test_the_gateway_refusals_are_retried_as_the_config_says(launcher: Any) -> None:
    """No worker: every attempt is NO_CAPACITY with RetryInfo. The gateway sees exactly
    maxAttempts of them from one client call, which ends with the last one's rich error."""
    controller = launcher.controller()
    gateway = launcher.gateway(controller)
    gateway.wait_ready()

    out = _python(gateway.grpc)

    assert out.returncode == 1, (out.stdout, out.stderr)
    first, *details = _lines(out)
    assert first.startswith("UNAVAILABLE: "), out.stdout
    assert any(line.startswith("reason: NO_CAPACITY") for line in details), out.stdout
    assert any(line.startswith("retry after: ") for line in details), out.stdout

    refused = _attempts_refused(gateway)
    assert refused == MAX_ATTEMPTS, (refused, out.stdout, gateway.describe())


# -- Node ---------------------------------------------------------------------------------------


def test_node_client_prints_the_answer(stack: Any, node_client: list[str]) -> None:
    out = _run([*node_client, stack.gateway.grpc])
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert out.stdout.strip(), "no output printed"
    assert not out.stdout.startswith(("INVALID", "UNAVAILABLE")), out.stdout


def test_node_client_decodes_the_rich_error(stack: Any, node_client: list[str]) -> None:
    out = _run([*node_client, stack.gateway.grpc, e2e.API_KEY, "9999"])
    assert out.returncode == 1, (out.stdout, out.stderr)
    first, *details = _lines(out)
    assert first.startswith("INVALID_ARGUMENT: "), out.stdout
    assert 'reason: INVALID_FIELD {"field":"max_output_tokens"}' in details, out.stdout
    violations = [line for line in details if line.startswith("field violation: ")]
    assert len(violations) == 1, out.stdout
    assert violations[0].startswith("field violation: max_output_tokens: "), out.stdout
    assert "4096" in violations[0] or "4,096" in violations[0], out.stdout


def test_node_client_reads_the_retry_advice(launcher: Any, node_client: list[str]) -> None:
    """Against a gateway without workers: NO_CAPACITY after the retries, with its RetryInfo."""
    controller = launcher.controller()
    gateway = launcher.gateway(controller)
    gateway.wait_ready()

    out = _run([*node_client, gateway.grpc])

    assert out.returncode == 1, (out.stdout, out.stderr)
    first, *details = _lines(out)
    assert first.startswith("UNAVAILABLE: "), out.stdout
    assert any(line.startswith("reason: NO_CAPACITY") for line in details), out.stdout
    delays = [line for line in details if line.startswith("retry after: ")]
    assert len(delays) == 1 and delays[0].endswith(" ms"), out.stdout
    assert int(delays[0].split()[2]) > 0, out.stdout

    refused = _attempts_refused(gateway)
    assert refused == MAX_ATTEMPTS, (refused, out.stdout, gateway.describe())
