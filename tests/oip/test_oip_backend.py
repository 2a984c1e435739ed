"""``halcyon worker --runtime oip`` in front of a real KServe model server, as processes.

The backend (``scripts/kserve_decoder.py`` in ``.tools/kserve``) serves the generated ONNX
decoder; ``--directives`` lets a prompt ask it to fail (``#fail``) or to take its time
(``#sleep=MS``), and it refuses a third concurrent request as overloaded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.errors import RichError, parse_rpc_error
from halcyon.v1 import worker_pb2, worker_pb2_grpc
from tests.support import e2e
from tests.support.oip import BACKEND_MODEL, Backend, free_port
from worker.onnx_engine import DecoderEngine

pytestmark = pytest.mark.e2e

MODEL, VERSION = e2e.MODEL, "v1"


def _oip_flags(backend: str, *extra: str) -> tuple[str, ...]:
    return ("--runtime", "oip", "--backend", backend, "--backend-model", BACKEND_MODEL, *extra)


def _standalone(launcher: Any, name: str, *flags: str) -> Any:
    """A worker with no controller (gateways are not needed to call ExecuteBatch)."""
    return launcher.spawn(
        name, "worker", "--replica-id", name, "--model", MODEL, "--version", VERSION, *flags
    )


def _error_records(proc: Any) -> list[dict[str, Any]]:
    records = []
    for line in proc.log_file.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("level") == "ERROR":
            records.append(record)
    return records


@pytest.fixture(scope="module")
def oip_worker(
    shared_backend: Backend, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, worker_pb2_grpc.WorkerServiceStub]]:
    """One oip worker (4 slots) in front of the shared backend, and a stub to call it."""
    launcher = e2e.Launcher(tmp_path_factory.mktemp("oip-worker"))
    try:
        proc = _standalone(
            launcher, "oip-worker", "--slots", "4", *_oip_flags(shared_backend.address)
        )
        proc.wait_ready(30)
        with grpc.insecure_channel(proc.grpc) as channel:
            yield proc, worker_pb2_grpc.WorkerServiceStub(channel)
    finally:
        launcher.close()


def _batch(batch_id: str, *prompts: str, max_tokens: int = 12) -> worker_pb2.ExecuteBatchRequest:
    return worker_pb2.ExecuteBatchRequest(
        batch_id=batch_id,
        model=MODEL,
        version=VERSION,
        items=[
            worker_pb2.BatchItem(
                id=f"{batch_id}-{i}", input=p, input_tokens=len(p), max_output_tokens=max_tokens
            )
            for i, p in enumerate(prompts)
        ],
    )


def _call(
    stub: worker_pb2_grpc.WorkerServiceStub, request: worker_pb2.ExecuteBatchRequest, timeout: float
) -> worker_pb2.ExecuteBatchResponse | RichError:
    try:
        reply: worker_pb2.ExecuteBatchResponse = stub.ExecuteBatch(
            request,
            metadata=(("authorization", f"Bearer {e2e.FLEET_TOKEN}"),),
            timeout=timeout,
        )
    except grpc.RpcError as err:
        return parse_rpc_error(err)
    return reply


def test_execute_batch_returns_the_models_outputs_from_one_model_infer(
    oip_worker: tuple[Any, worker_pb2_grpc.WorkerServiceStub],
    shared_backend: Backend,
    decoder_model: Path,
) -> None:
    proc, stub = oip_worker
    prompts = ["hello", "the quick brown fox", "halcyon", "a"]
    batches_before = shared_backend.log_text().count("batch of 4 ")
    reply = _call(stub, _batch("real", *prompts, max_tokens=12), timeout=20)
    assert isinstance(reply, worker_pb2.ExecuteBatchResponse), reply
    # The same model run here, in-process: the worker returned what the backend generated.
    expected = DecoderEngine(str(decoder_model)).generate([p.encode() for p in prompts], [12] * 4)
    assert [r.output for r in reply.results] == [
        e.decode("utf-8", errors="replace") for e in expected
    ]
    assert [r.id for r in reply.results] == [f"real-{i}" for i in range(4)]
    assert [r.output_tokens for r in reply.results] == [12] * 4
    assert reply.batch_tokens == sum(len(p) + 12 for p in prompts)
    assert reply.device_time.ToNanoseconds() > 0
    # One ModelInfer carried the whole batch (the backend logs one line per request).
    assert shared_backend.log_text().count("batch of 4 ") == batches_before + 1
    # The warm-up (1 item, then 8) was logged at start.
    assert '"OIP backend warmed up"' in proc.log_file.read_text()


def test_backend_overload_is_replica_busy_not_a_fault(
    oip_worker: tuple[Any, worker_pb2_grpc.WorkerServiceStub],
) -> None:
    _, stub = oip_worker
    # The backend takes 2 requests at a time: the third of three slow batches is refused.
    with ThreadPoolExecutor(3) as pool:
        replies = list(
            pool.map(
                lambda i: _call(stub, _batch(f"busy{i}", f"#sleep=1500 {i}"), timeout=20),
                range(3),
            )
        )
    busy = [r for r in replies if isinstance(r, RichError)]
    assert len(busy) == 1, replies
    err = busy[0]
    assert err.code is grpc.StatusCode.RESOURCE_EXHAUSTED and err.reason == "REPLICA_BUSY"
    assert err.metadata.get("source") == "backend"
    assert "backend RESOURCE_EXHAUSTED: server overloaded" in err.message
    assert err.retry_after_s == pytest.approx(0.25)  # the backend's grpc-retry-pushback-ms


def test_backend_error_is_device_fault_with_the_backends_message(
    oip_worker: tuple[Any, worker_pb2_grpc.WorkerServiceStub],
) -> None:
    _, stub = oip_worker
    err = _call(stub, _batch("fail", "fine", "#fail please"), timeout=20)
    assert isinstance(err, RichError), err
    assert err.code is grpc.StatusCode.INTERNAL and err.reason == "DEVICE_FAULT"
    assert err.message.startswith("backend INTERNAL: injected backend fault: b'#fail please'")


def test_a_passed_deadline_cancels_the_backend_call(
    oip_worker: tuple[Any, worker_pb2_grpc.WorkerServiceStub], shared_backend: Backend
) -> None:
    _, stub = oip_worker
    cancelled_before = shared_backend.log_text().count("cancelled: request")
    err = _call(stub, _batch("late", "#sleep=20000 never"), timeout=0.5)
    assert isinstance(err, RichError) and err.code is grpc.StatusCode.DEADLINE_EXCEEDED
    e2e.wait_for(
        lambda: shared_backend.log_text().count("cancelled: request") > cancelled_before,
        10,
        "the backend to log the cancelled ModelInfer",
    )
    # The slot is free again at once: the next batch runs.
    assert isinstance(
        _call(stub, _batch("after", "ok"), timeout=20), worker_pb2.ExecuteBatchResponse
    )


def test_wrong_tensor_name_exits_at_start_with_one_line(
    shared_backend: Backend, tmp_path: Path
) -> None:
    launcher = e2e.Launcher(tmp_path)
    try:
        proc = _standalone(
            launcher,
            "wrong-tensor",
            *_oip_flags(shared_backend.address, "--input-tensor", "prompt"),
        )
        assert proc.wait_exit(30) == 2
        errors = _error_records(proc)
        assert len(errors) == 1, errors
        assert errors[0]["error"] == (
            f"backend model {BACKEND_MODEL!r} has no input tensor 'prompt' (its inputs: "
            "text_input BYTES, max_tokens INT32); set --input-tensor"
        )
        assert not proc.ready_file.exists()
    finally:
        launcher.close()


def test_unreachable_backend_fails_start_after_the_bounded_wait(tmp_path: Path) -> None:
    launcher = e2e.Launcher(tmp_path)
    nobody = f"127.0.0.1:{free_port()}"
    try:
        started = time.monotonic()
        proc = _standalone(
            launcher, "no-backend", *_oip_flags(nobody, "--backend-start-timeout", "1.5")
        )
        assert proc.wait_exit(30) == 2
        assert time.monotonic() - started < 15
        errors = _error_records(proc)
        assert len(errors) == 1, errors
        message = errors[0]["error"]
        assert message.startswith(
            f"OIP backend {nobody} not ready for model {BACKEND_MODEL!r} after 1.5 s: UNAVAILABLE"
        ), message
        assert message.endswith("(check --backend and --backend-model)")
    finally:
        launcher.close()
