"""``halcyon worker`` as a real process: ready file, grpcurl, SIGTERM draining in-flight work."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from common.auth import bearer_metadata
from halcyon.v1 import worker_pb2, worker_pb2_grpc

pytestmark = pytest.mark.e2e

GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")
TOKEN = "process-test-fleet-token"


async def _wait_for_file(
    path: Path, proc: asyncio.subprocess.Process, timeout_s: float
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(path.exists):
        if proc.returncode is not None:
            raise AssertionError(f"worker exited early with {proc.returncode}")
        if loop.time() > deadline:
            raise AssertionError("worker did not write its ready file in time")
        await asyncio.sleep(0.02)
    return dict(json.loads(await asyncio.to_thread(path.read_text)))


async def _grpcurl(*args: str) -> tuple[int, str]:
    assert GRPCURL is not None
    proc = await asyncio.create_subprocess_exec(
        GRPCURL,
        "-plaintext",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode()


async def test_worker_process_serves_and_drains_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "worker.json"
    env = {**os.environ, "HALCYON_FLEET_TOKEN": TOKEN}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "halcyon",
        "worker",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--ready-file",
        str(ready),
        "--replica-id",
        "proc-1",
        "--jitter",
        "0",
        "--intercept-ms",
        "400",
        "--shutdown-grace",
        "10",
        "--drain-delay",
        "0",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        info = await _wait_for_file(ready, proc, 30)
        assert info["pid"] == proc.pid
        address = info["grpc"]

        if GRPCURL is not None:
            rc, out = await _grpcurl(address, "list")
            assert rc == 0, out
            assert "halcyon.v1.WorkerService" in out.split()
            rc, out = await _grpcurl(address, "describe", "halcyon.v1.WorkerService")
            assert rc == 0 and "rpc ExecuteBatch" in out, out
            # Ready once its warm-up (two 400 ms batches) is measured: NOT_SERVING until then.
            for _ in range(100):
                rc, out = await _grpcurl(
                    "-d", '{"service":"readiness"}', address, "grpc.health.v1.Health/Check"
                )
                if rc != 0 or json.loads(out) == {"status": "SERVING"}:
                    break
                await asyncio.sleep(0.1)
            assert rc == 0 and json.loads(out) == {"status": "SERVING"}, out

        async with grpc.aio.insecure_channel(address) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            request = worker_pb2.ExecuteBatchRequest(
                batch_id="b",
                model="llama-3-8b",
                version="v1",
                items=[
                    worker_pb2.BatchItem(id="a", input="hi", input_tokens=8, max_output_tokens=8)
                ],
            )
            in_flight = asyncio.ensure_future(
                stub.ExecuteBatch(request, metadata=bearer_metadata(TOKEN), timeout=20)
            )
            # Wait until the worker is really executing it, then ask it to stop.
            while True:
                load = await stub.Describe(
                    worker_pb2.DescribeRequest(), metadata=bearer_metadata(TOKEN), timeout=5
                )
                if load.load.busy_slots == 1:
                    break
                assert not in_flight.done()
                await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            reply = await in_flight  # the in-flight batch still completes
            assert [r.id for r in reply.results] == ["a"]
            assert reply.replica_id == "proc-1"
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert proc.stderr is not None
        lines = [json.loads(line) for line in (await proc.stderr.read()).decode().splitlines()]
        messages = [line["msg"] for line in lines]
        assert "draining" in messages and "drained" in messages
        drained = next(line for line in lines if line["msg"] == "drained")
        assert (drained["finished"], drained["cancelled"]) == (1, 0)
        assert all(line["service"] == "worker" for line in lines)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_tls_file_that_cannot_be_read_is_one_line_that_names_the_flags(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing.pem"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halcyon", "worker", "--listen", "127.0.0.1:0",
        "--metrics-listen", "off", "--tls-cert", str(missing), "--tls-key", str(missing),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HALCYON_FLEET_TOKEN": TOKEN},
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    errors = [json.loads(line) for line in err.decode().splitlines() if '"ERROR"' in line]
    assert [e["msg"] for e in errors] == ["worker failed to start"]
    assert errors[0]["error"] == (
        f"cannot read {missing}: No such file or directory; check --tls-cert, --tls-key and "
        "--tls-ca"
    )
    assert "Traceback" not in err.decode()


async def test_sigterm_during_a_long_warm_up_exits_0_at_once(tmp_path: Path) -> None:
    """A device whose batches take 30 s measures its warm-up for a minute before it is
    ready; a SIGTERM meanwhile ends the warm-up and the process (exit 0, not registered),
    instead of killing it unhandled or waiting the minute out."""
    ready = tmp_path / "worker.json"
    env = {**os.environ, "HALCYON_FLEET_TOKEN": TOKEN}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halcyon", "worker", "--listen", "127.0.0.1:0",
        "--metrics-listen", "off", "--ready-file", str(ready), "--drain-delay", "0",
        "--intercept-ms", "30000", "--ms-per-token", "0", "--jitter", "0",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_for_file(ready, proc, 30)
        await asyncio.sleep(0.5)  # well inside the first 30 s warm-up batch
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert proc.stderr is not None
        messages = [
            json.loads(line)["msg"] for line in (await proc.stderr.read()).decode().splitlines()
        ]
        assert "warm-up interrupted by a signal: shutting down, not registering" in messages
        assert "worker ready" not in messages
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
