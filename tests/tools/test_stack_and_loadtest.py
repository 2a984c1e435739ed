"""`halcyon stack` brings the system up and says how to call it; `halcyon loadtest` drives it.

Real processes on free ports: the stack's own controller, gateway and heterogeneous fleet,
and the load generator as a separate process reading the gateway's metrics.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _wait_for_line(proc: subprocess.Popen[str], pattern: str, timeout_s: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line.rstrip("\n"))
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s}s; got {lines}")


def test_stack_prints_how_to_call_it_and_loadtest_drives_it(tmp_path: Path) -> None:
    stack = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "halcyon",
            "stack",
            "--canary",
            "--gateway-listen",
            "127.0.0.1:0",
            "--gateway-metrics-listen",
            "127.0.0.1:0",
            "--controller-listen",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = _wait_for_line(stack, r"grpc\.health\.v1\.Health/Check", timeout_s=60)
        text = "\n".join(lines)
        assert "Halcyon stack is up" in text
        rows = {
            m.group(1): (m.group(2), m.group(3))
            for m in re.finditer(r"^\s+(\S+)\s+(127\.0\.0\.1:\d+)\s+(127\.0\.0\.1:\d+)", text, re.M)
        }
        assert set(rows) == {"controller", "replica-a", "replica-b", "replica-c", "gateway"}
        gateway, gateway_metrics = rows["gateway"]
        assert "halcyon.v1.InferService/Infer" in text and "x-api-key" in text

        # The printed grpcurl call works as printed (modulo the binary's path).
        call = next(i for i, line in enumerate(lines) if "grpcurl" in line and "x-api-key" in line)
        body = re.search(r"-d '(.+)'", lines[call + 1])
        assert body is not None
        grpcurl = Path(sys.executable).parent / "grpcurl"
        out = subprocess.run(
            [str(grpcurl), "-plaintext", "-H", "x-api-key: demo-key-premium", "-d",
             body.group(1), gateway, "halcyon.v1.InferService/Infer"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        answer = json.loads(out.stdout)
        assert answer["version"] == "v1" and answer["replica_id"] in {"replica-a", "replica-b"}

        report = subprocess.run(
            [sys.executable, "-m", "halcyon", "loadtest", "--target", gateway,
             "--clients", "8", "--seconds", "3", "--json", "--gateway-metrics", gateway_metrics],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        result = json.loads(report.stdout)
        assert result["requests"] > 50
        assert result["success_rate"] == 1.0, result["outcomes"]
        assert result["versions"] == {"v1": result["requests"]}  # no rollout: stable only
        assert result["p50_ms"] <= result["p95_ms"] <= result["p99_ms"]
        # The stack's devices take real time, so the added latency is a strict part of it.
        assert 0.0 < result["added_p50_ms"] < result["p50_ms"]
        assert result["mean_batch_size"] >= 1.0
        assert result["gateway_cpu_ms_per_request"] is not None
        # The gateway's own batch count: a plain mean per batch, never above the per-answer one.
        assert result["gateway_batches"] >= 1
        assert 1.0 <= result["gateway_requests_per_batch"] <= result["mean_batch_size"] + 0.5
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            code = stack.wait(timeout=30)
        finally:
            if stack.poll() is None:
                stack.kill()
    assert code == 0
    # Ctrl-C stops every child: none of the stack's processes is left behind.
    for ready in tmp_path.glob("*.ready.json"):
        pid = json.loads(ready.read_text())["pid"]
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        ), f"{ready.stem} (pid {pid}) still running"


def test_loadtest_explains_an_unreachable_gateway() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "halcyon", "loadtest", "--target", "127.0.0.1:1",
         "--clients", "1", "--seconds", "1", "--connect-timeout", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "no gateway answered at 127.0.0.1:1" in proc.stderr
