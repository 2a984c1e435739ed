"""OipRuntime against an in-process fake OIP server: wire format, contract check, error
mapping, readiness, faults and cancellation — the cases a real server will not produce on
demand. (The real KServe server is in test_oip_backend.py and test_oip_e2e.py.)"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import grpc.aio
import pytest

from common.clock import MonotonicClock
from common.rng import SeededRng
from halcyon.oip import grpc_predict_v2_pb2 as pb
from halcyon.oip import grpc_predict_v2_pb2_grpc as pb_grpc
from worker.faults import FaultInjector
from worker.oip_runtime import (
    OipRuntime,
    OnlineCost,
    decode_bytes_tensor,
    encode_bytes_tensor,
    encode_int32_tensor,
)
from worker.runtime import DeviceFault, RuntimeBusy, RuntimeStartError, WorkItem
from worker.runtimes import OipOptions

Handler = Callable[[pb.ModelInferRequest, grpc.aio.ServicerContext], Awaitable[Any]]


def _tensor(name: str, datatype: str) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(name=name, datatype=datatype, shape=[-1, 1])


def _echo(request: pb.ModelInferRequest, *, typed: bool = False) -> pb.ModelInferResponse:
    """Each prompt reversed, cut to its max_tokens; raw outputs, or typed contents."""
    prompts = decode_bytes_tensor(request.raw_input_contents[0])
    raw = request.raw_input_contents[1]
    budgets = struct.unpack(f"<{len(raw) // 4}i", raw)
    texts = [p[::-1][:n] for p, n in zip(prompts, budgets, strict=True)]
    response = pb.ModelInferResponse(model_name=request.model_name)
    out = response.outputs.add(name="text_output", datatype="BYTES", shape=[len(texts), 1])
    if typed:
        out.contents.bytes_contents.extend(texts)
    else:
        response.raw_output_contents.append(encode_bytes_tensor(texts))
    return response


@dataclass
class FakeBackend(pb_grpc.GRPCInferenceServiceServicer):
    """A scriptable GRPCInferenceService."""

    inputs: list[tuple[str, str]] = field(
        default_factory=lambda: [("text_input", "BYTES"), ("max_tokens", "INT32")]
    )
    outputs: list[tuple[str, str]] = field(default_factory=lambda: [("text_output", "BYTES")])
    model_ready: bool = True
    handler: Handler | None = None
    requests: list[pb.ModelInferRequest] = field(default_factory=list)
    cancelled: int = 0

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no repository")

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no repository")

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.model_ready)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="fake", version="0")

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        return pb.ModelMetadataResponse(
            name=request.name,
            inputs=[_tensor(n, d) for n, d in self.inputs],
            outputs=[_tensor(n, d) for n, d in self.outputs],
        )

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        self.requests.append(request)
        try:
            if self.handler is not None:
                return await self.handler(request, context)
            return _echo(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


@dataclass
class Served:
    fake: FakeBackend
    server: grpc.aio.Server
    address: str

    def options(self, **changes: Any) -> OipOptions:
        base = OipOptions(
            backend=self.address,
            backend_model="decoder",
            readiness_interval_s=0.05,
            start_timeout_s=2.0,
        )
        return replace(base, **changes)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    fake = FakeBackend()
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Served(fake, server, f"127.0.0.1:{port}")
    finally:
        await server.stop(None)


async def _started(served: Served, **changes: Any) -> OipRuntime:
    runtime = OipRuntime(served.options(**changes), clock=MonotonicClock())
    await runtime.start()
    return runtime


def _items(*prompts: str, max_tokens: int = 4) -> list[WorkItem]:
    return [WorkItem(f"i{n}", p, len(p), max_tokens) for n, p in enumerate(prompts)]


# -- pure pieces ---------------------------------------------------------------------------


def test_bytes_tensor_round_trip_and_truncation() -> None:
    elements = [b"", b"hello", "héllo".encode(), bytes(range(256))]
    raw = encode_bytes_tensor(elements)
    assert raw[:4] == b"\x00\x00\x00\x00" and raw[4:8] == struct.pack("<I", 5)
    assert decode_bytes_tensor(raw) == elements
    assert encode_int32_tensor([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    with pytest.raises(ValueError, match="truncated"):
        decode_bytes_tensor(raw[:-1])
    with pytest.raises(ValueError, match="truncated"):
        decode_bytes_tensor(b"\x01\x00")


def test_online_cost_fits_a_line_and_degrades_gracefully() -> None:
    cost = OnlineCost()
    assert cost.estimate(1000) == 0.0
    for tokens in (100, 1000, 100, 1000):
        cost.observe(tokens, 0.010 + 0.00002 * tokens)
    a, b = cost.line()
    assert a == pytest.approx(0.010, rel=1e-6) and b == pytest.approx(0.00002, rel=1e-6)
    one_size = OnlineCost()
    one_size.observe(500, 0.05)
    assert one_size.estimate(1000) == pytest.approx(0.1)  # through the origin
    flat = OnlineCost()
    flat.observe(100, 0.05)
    flat.observe(1000, 0.02)  # bigger was faster: no negative slope
    assert flat.line()[1] == 0.0 and flat.estimate(5000) > 0


# -- start: the contract -------------------------------------------------------------------


async def test_start_checks_metadata_warms_up_and_batches_along_dim0(served: Served) -> None:
    runtime = await _started(served)
    try:
        assert runtime.ready() and runtime.backend_name == "fake 0"
        assert [s[0] for s in runtime.warmup_samples] == [1, 8]
        assert all(s[3] > 0 for s in runtime.warmup_samples)
        assert len(await runtime.warm_up()) == 2
        assert runtime.estimate_s(100) > 0
        before = len(served.fake.requests)
        result = await runtime.execute(_items("abc", "hello world", max_tokens=4))
        assert len(served.fake.requests) == before + 1  # one ModelInfer for the batch
        request = served.fake.requests[-1]
        assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
            ("text_input", "BYTES", [2, 1]),
            ("max_tokens", "INT32", [2, 1]),
        ]
        assert [o.output for o in result.outputs] == ["cba", "dlro"]
        assert [o.output_tokens for o in result.outputs] == [3, 4]  # min(budget, bytes)
        assert result.batch_tokens == 3 + 4 + 11 + 4
    finally:
        await runtime.close()


async def test_typed_contents_and_an_output_tokens_tensor_are_read(served: Served) -> None:
    served.fake.outputs.append(("output_tokens", "INT32"))

    async def typed(request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        response = _echo(request, typed=True)
        n = len(response.outputs[0].contents.bytes_contents)
        counts = response.outputs.add(name="output_tokens", datatype="INT32", shape=[n, 1])
        counts.contents.int_contents.extend([7] * n)
        return response

    served.fake.handler = typed
    runtime = await _started(served)
    try:
        result = await runtime.execute(_items("xyz"))
        assert result.outputs[0].output == "zyx" and result.outputs[0].output_tokens == 7
        assert [o.name for o in served.fake.requests[-1].outputs] == [
            "text_output",
            "output_tokens",
        ]
    finally:
        await runtime.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"input_name": "prompt"},
            "backend model 'decoder' has no input tensor 'prompt' (its inputs: text_input BYTES, "
            "max_tokens INT32); set --input-tensor",
        ),
        (
            {"output_name": "generated"},
            "backend model 'decoder' has no output tensor 'generated'",
        ),
    ],
)
async def test_wrong_tensor_names_fail_start_with_one_line(
    served: Served, change: dict[str, str], message: str
) -> None:
    with pytest.raises(RuntimeStartError) as info:
        await _started(served, **change)
    assert message in str(info.value) and "\n" not in str(info.value)


async def test_wrong_datatype_fails_start_naming_the_tensor(served: Served) -> None:
    served.fake.inputs = [("text_input", "BYTES"), ("max_tokens", "INT64")]
    with pytest.raises(RuntimeStartError) as info:
        await _started(served)
    assert str(info.value) == (
        "backend model 'decoder' input tensor 'max_tokens' is INT64, expected INT32"
    )


async def test_a_model_never_ready_fails_start_after_the_bounded_wait(served: Served) -> None:
    served.fake.model_ready = False
    with pytest.raises(RuntimeStartError) as info:
        await _started(served, start_timeout_s=0.5)
    assert "not ready for model 'decoder' after 0.5 s: model 'decoder' is not ready" in str(
        info.value
    )


# -- errors --------------------------------------------------------------------------------


async def test_error_mapping(served: Served) -> None:
    runtime = await _started(served)
    status: dict[str, Any] = {}

    async def refuse(request: pb.ModelInferRequest, context: Any) -> Any:
        if status.get("trailer"):
            context.set_trailing_metadata((("grpc-retry-pushback-ms", status["trailer"]),))
        await context.abort(status["code"], status["details"])

    served.fake.handler = refuse
    try:
        status.update(code=grpc.StatusCode.RESOURCE_EXHAUSTED, details="queue full", trailer="250")
        with pytest.raises(RuntimeBusy) as busy:
            await runtime.execute(_items("a"))
        assert str(busy.value) == "backend RESOURCE_EXHAUSTED: queue full"
        assert busy.value.retry_after_s == pytest.approx(0.25)

        # A connected backend answering UNAVAILABLE is overloaded; no trailer: recent batches.
        status.update(code=grpc.StatusCode.UNAVAILABLE, details="too busy", trailer=None)
        with pytest.raises(RuntimeBusy) as busy:
            await runtime.execute(_items("a"))
        assert 0.005 <= busy.value.retry_after_s <= 5.0

        status.update(code=grpc.StatusCode.INTERNAL, details="CUDA error: out of memory")
        with pytest.raises(DeviceFault) as fault:
            await runtime.execute(_items("a"))
        assert str(fault.value) == "backend INTERNAL: CUDA error: out of memory"

        status.update(code=grpc.StatusCode.INVALID_ARGUMENT, details="bad\nshape")
        with pytest.raises(DeviceFault, match=r"^backend INVALID_ARGUMENT: bad shape$"):
            await runtime.execute(_items("a"))
    finally:
        await runtime.close()


async def test_a_backend_gone_mid_call_is_a_fault_and_readiness_drops(served: Served) -> None:
    runtime = await _started(served, readiness_interval_s=0.05)
    entered = asyncio.Event()

    async def hang(request: pb.ModelInferRequest, context: Any) -> Any:
        entered.set()
        await asyncio.Event().wait()

    served.fake.handler = hang
    try:
        call = asyncio.ensure_future(runtime.execute(_items("a")))
        await asyncio.wait_for(entered.wait(), 5)
        await served.server.stop(None)  # the connection drops under the call
        with pytest.raises(DeviceFault, match=r"^backend UNAVAILABLE"):
            await asyncio.wait_for(call, 5)
        for _ in range(100):
            if not runtime.ready():
                break
            await asyncio.sleep(0.02)
        assert not runtime.ready()
        # And a batch sent while it is away fails fast as a fault, not as busy.
        with pytest.raises(DeviceFault, match=r"^backend UNAVAILABLE"):
            await asyncio.wait_for(runtime.execute(_items("a")), 5)
    finally:
        await runtime.close()


# -- readiness, faults, cancellation -------------------------------------------------------


async def test_readiness_follows_model_ready(served: Served) -> None:
    runtime = await _started(served, readiness_interval_s=0.05)

    async def until(value: bool) -> None:
        for _ in range(200):
            if runtime.ready() is value:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"ready() never became {value}")

    try:
        served.fake.model_ready = False
        await until(False)
        served.fake.model_ready = True
        await until(True)
        assert runtime.readiness_changes == 2
    finally:
        await runtime.close()
    assert not runtime.ready()


async def test_injected_faults_never_reach_the_backend(served: Served) -> None:
    faults = FaultInjector(fail_rate=1.0, fail_fast_ms=1.0, rng=SeededRng(0))
    runtime = OipRuntime(served.options(), clock=MonotonicClock(), faults=faults)
    await runtime.start()  # the warm-up runs without injected faults
    try:
        before = len(served.fake.requests)
        with pytest.raises(DeviceFault, match="injected device fault"):
            await runtime.execute(_items("a"))
        assert len(served.fake.requests) == before
    finally:
        await runtime.close()


async def test_cancelling_a_batch_cancels_the_backend_call(served: Served) -> None:
    runtime = await _started(served)
    entered = asyncio.Event()

    async def slow(request: pb.ModelInferRequest, context: Any) -> Any:
        entered.set()
        await asyncio.sleep(30)

    served.fake.handler = slow
    try:
        task = asyncio.ensure_future(runtime.execute(_items("a")))
        await asyncio.wait_for(entered.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if served.fake.cancelled:
                break
            await asyncio.sleep(0.01)
        assert served.fake.cancelled == 1  # the backend saw the RPC cancelled
    finally:
        await runtime.close()


async def test_a_call_timeout_bounds_a_hung_backend(served: Served) -> None:
    runtime = await _started(served, call_timeout_s=0.2)

    async def slow(request: pb.ModelInferRequest, context: Any) -> Any:
        await asyncio.sleep(30)

    served.fake.handler = slow
    try:
        with pytest.raises(DeviceFault, match=r"^backend DEADLINE_EXCEEDED"):
            await runtime.execute(_items("a"))
    finally:
        await runtime.close()
