"""``halcyon worker --runtime onnx`` as a real process: serves ExecuteBatch with the model's real
outputs, drains on SIGTERM, and exits non-zero at start with one log line for a bad model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from onnx_support import require_onnx

require_onnx()

from common.auth import bearer_metadata  # noqa: E402
from common.credentials import DEV_FLEET_TOKEN  # noqa: E402
from halcyon.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402
from worker.onnx_engine import DecoderEngine  # noqa: E402
from worker.onnx_model import build_model, generate_preset  # noqa: E402
from worker.onnx_runtime import output_text  # noqa: E402

pytestmark = pytest.mark.e2e


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def _spawn(model: Path, ready: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halcyon", "worker", "--dev-mode",
        "--runtime", "onnx", "--model-file", str(model),
        "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
        "--ready-file", str(ready), "--replica-id", "onnx-1",
        "--drain-delay", "0", "--shutdown-grace", "10",
        env=_env(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


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


async def test_an_onnx_worker_answers_with_the_models_real_outputs(tmp_path: Path) -> None:
    model = generate_preset(tmp_path / "small.onnx", "small")
    ready = tmp_path / "worker.json"
    proc = await _spawn(model, ready)
    try:
        info = await _wait_for_file(ready, proc, 60)
        prompts = ["hello", "the quick brown fox", ""]
        budgets = [16, 40, 5]
        request = worker_pb2.ExecuteBatchRequest(
            batch_id="b1",
            model="llama-3-8b",
            version="v1",
            items=[
                worker_pb2.BatchItem(
                    id=f"r{i}", input=p, input_tokens=len(p.encode()), max_output_tokens=n
                )
                for i, (p, n) in enumerate(zip(prompts, budgets, strict=True))
            ],
        )
        async with grpc.aio.insecure_channel(info["grpc"]) as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            reply = await stub.ExecuteBatch(
                request, metadata=bearer_metadata(DEV_FLEET_TOKEN), timeout=30
            )
        engine = DecoderEngine(str(model))
        expected = engine.generate([p.encode() for p in prompts], budgets)
        assert reply.replica_id == "onnx-1"
        assert [r.id for r in reply.results] == ["r0", "r1", "r2"]
        assert [r.output for r in reply.results] == [output_text(e) for e in expected]
        assert [r.output_tokens for r in reply.results] == budgets
        assert reply.batch_tokens == sum(len(p.encode()) for p in prompts) + sum(budgets)
        assert reply.device_time.ToTimedelta().total_seconds() > 0

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert proc.stderr is not None
        lines = [json.loads(line) for line in (await proc.stderr.read()).decode().splitlines()]
        started = next(line for line in lines if line["msg"] == "worker ready")
        assert started["runtime"] == "onnx"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _start_error(model: Path, tmp_path: Path) -> dict[str, Any]:
    proc = await _spawn(model, tmp_path / "never.json")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    assert not (tmp_path / "never.json").exists()
    errors = [json.loads(line) for line in text.splitlines() if '"ERROR"' in line]
    assert [e["msg"] for e in errors] == ["the model runtime cannot serve"], text
    return dict(errors[0])


async def test_a_file_that_is_not_onnx_stops_the_worker_at_start(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"definitely not a protobuf\x00\xff" * 4)
    error = await _start_error(junk, tmp_path)
    assert error["error"].startswith(f"{junk}: not a loadable ONNX model: ")
    assert "\n" not in error["error"]


async def test_a_model_off_the_contract_names_the_input(tmp_path: Path) -> None:
    from onnx import TensorProto

    model = build_model(layers=1, d_model=32, heads=2, max_context=32)
    for value in model.graph.input:
        if value.name == "input_ids":
            value.type.tensor_type.elem_type = TensorProto.INT32
    path = tmp_path / "int32.onnx"
    path.write_bytes(model.SerializeToString())
    error = await _start_error(path, tmp_path)
    assert error["error"] == (
        "int32.onnx: input 'input_ids' must be int64 [batch, sequence], "
        "found int32 [batch, sequence]"
    )
