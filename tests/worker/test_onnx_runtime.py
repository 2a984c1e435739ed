"""``OnnxRuntime``: the worker's ModelRuntime over the ONNX engine — start and its one-line
errors, warm-up samples and the cost estimate, real outputs, faults, and cancellation that
really stops the CPU."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from onnx_support import require_onnx

require_onnx()

from common.clock import ManualClock, MonotonicClock  # noqa: E402
from common.rng import SeededRng  # noqa: E402
from worker.faults import FaultInjector  # noqa: E402
from worker.onnx_engine import DecoderEngine  # noqa: E402
from worker.onnx_model import generate_preset  # noqa: E402
from worker.onnx_runtime import CostFit, OnnxRuntime, output_text  # noqa: E402
from worker.replica import Replica  # noqa: E402
from worker.runtime import DeviceFault, RuntimeStartError, WorkItem  # noqa: E402
from worker.runtimes import OnnxOptions, RuntimeKind, SimulatedOptions, build_runtime  # noqa: E402
from worker.slots import SlotTable  # noqa: E402


@pytest.fixture(scope="module")
def small_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_preset(tmp_path_factory.mktemp("models") / "small.onnx", "small")


def _items(*specs: tuple[str, int]) -> list[WorkItem]:
    return [
        WorkItem(id=f"r{i}", input=text, input_tokens=len(text.encode()), max_output_tokens=n)
        for i, (text, n) in enumerate(specs)
    ]


async def _no_sleep(seconds: float) -> None:
    return None


async def _started(
    path: Path,
    faults: FaultInjector | None = None,
    *,
    warmup: bool = True,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> OnnxRuntime:
    runtime = OnnxRuntime(
        OnnxOptions(model_file=str(path)),
        clock=MonotonicClock(),
        faults=faults,
        sleep=sleep,
        warmup=warmup,
    )
    await runtime.start()
    return runtime


def _process_cpu() -> float:
    return time.process_time()


async def test_build_runtime_makes_an_onnx_runtime(small_path: Path) -> None:
    runtime = build_runtime(
        RuntimeKind.ONNX,
        simulated=SimulatedOptions(),
        onnx=OnnxOptions(model_file=str(small_path)),
        oip=None,
        clock=MonotonicClock(),
        faults=None,
    )
    assert isinstance(runtime, OnnxRuntime) and runtime.kind == "onnx"
    assert not runtime.ready()
    await runtime.start()
    try:
        assert runtime.ready()
    finally:
        await runtime.close()
    assert not runtime.ready()


async def test_start_warms_up_and_seeds_the_estimate(small_path: Path) -> None:
    runtime = await _started(small_path)
    try:
        samples = runtime.warmup_samples
        assert [(items, tokens, longest) for items, tokens, longest, _ in samples] == [
            (1, 32, 16),
            (8, 512, 32),
            (4, 896, 192),
        ]
        assert all(seconds > 0 for *_, seconds in samples)
        assert samples[1][3] > samples[0][3]  # the bigger batch cost more
        assert samples[2][3] > samples[1][3]  # and the long decode more still
        small, big, long = (runtime.estimate_s(t) for t in (32, 512, 896))
        assert 0 < small < big < long
        assert long == pytest.approx(samples[2][3], rel=0.5)
        reported = await runtime.warm_up()
        assert [
            (r.items, r.batch_tokens, r.longest_output_tokens, r.seconds) for r in reported
        ] == (samples)
    finally:
        await runtime.close()


async def test_execute_returns_the_engines_real_outputs(small_path: Path) -> None:
    runtime = await _started(small_path)
    try:
        items = _items(("hello", 12), ("", 3), ("caf\u00e9 au lait", 25))
        result = await runtime.execute(items)
        engine = DecoderEngine(str(small_path))
        expected = engine.generate([i.input.encode() for i in items], [12, 3, 25])
        assert [o.id for o in result.outputs] == ["r0", "r1", "r2"]
        assert [o.output for o in result.outputs] == [output_text(e) for e in expected]
        assert [o.output_tokens for o in result.outputs] == [12, 3, 25]
        assert [o.input_tokens for o in result.outputs] == [5, 0, 13]
        assert result.batch_tokens == 5 + 12 + 0 + 3 + 13 + 25
        assert result.device_time_s > 0
        before = runtime.cost.samples
        await runtime.execute(_items(("x", 4)))
        assert runtime.cost.samples == before + 1  # every batch feeds the estimate
    finally:
        await runtime.close()


def test_output_text_is_valid_utf8_without_nuls() -> None:
    text = output_text(b"ok\x00\xff\xfe caf\xc3\xa9")
    assert text == "ok\ufffd\ufffd caf\u00e9"
    text.encode("utf-8")


async def test_a_bad_model_fails_start_with_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not onnx at all")
    runtime = OnnxRuntime(OnnxOptions(model_file=str(junk)), clock=MonotonicClock(), faults=None)
    with pytest.raises(RuntimeStartError) as info:
        await runtime.start()
    message = str(info.value)
    assert message.startswith(f"{junk}: not a loadable ONNX model") and "\n" not in message
    assert not runtime.ready()
    missing = OnnxRuntime(
        OnnxOptions(model_file=str(tmp_path / "nope.onnx")), clock=MonotonicClock(), faults=None
    )
    with pytest.raises(RuntimeStartError, match="no such model file"):
        await missing.start()


async def test_an_engine_error_is_a_device_fault_with_its_words(small_path: Path) -> None:
    runtime = await _started(small_path, warmup=False)
    try:
        engine = runtime.engine
        assert engine is not None

        def broken(*args: object, **kwargs: object) -> list[bytes]:
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : out of\nmemory")

        engine.generate = broken  # type: ignore[method-assign]
        with pytest.raises(DeviceFault) as info:
            await runtime.execute(_items(("a", 3)))
        assert str(info.value) == (
            "onnxruntime: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : out of memory"
        )
    finally:
        await runtime.close()


async def test_injected_failure_fails_fast(small_path: Path) -> None:
    faults = FaultInjector(fail_rate=1.0, fail_fast_ms=1.0, rng=SeededRng(0))
    runtime = await _started(small_path, faults, warmup=False)
    try:
        started = time.perf_counter()
        with pytest.raises(DeviceFault, match="injected device fault"):
            await runtime.execute(_items(("a", 500)))
        assert time.perf_counter() - started < 0.1
    finally:
        await runtime.close()


async def test_injected_hang_waits_until_cancelled(small_path: Path) -> None:
    faults = FaultInjector(hang_rate=1.0, rng=SeededRng(0))
    runtime = await _started(small_path, faults, warmup=False)
    try:
        task = asyncio.ensure_future(runtime.execute(_items(("a", 3))))
        done, _ = await asyncio.wait({task}, timeout=0.2)
        assert not done
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await runtime.close()


async def test_injected_slowdown_stretches_the_device_time(small_path: Path) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await _no_sleep(seconds)

    faults = FaultInjector(slowdown=3.0, rng=SeededRng(0))
    runtime = await _started(small_path, faults, warmup=False, sleep=sleep)
    try:
        result = await runtime.execute(_items(("abc", 20)))
        assert len(slept) == 1
        # device time = elapsed + (3 - 1) × elapsed
        assert slept[0] == pytest.approx(result.device_time_s * 2 / 3)
        assert [o.output_tokens for o in result.outputs] == [20]
    finally:
        await runtime.close()
    slept.clear()
    warmed = await _started(small_path, faults, sleep=sleep)  # a slow device warms up slowly
    try:
        seconds = [sample[3] for sample in warmed.warmup_samples]
        assert slept == [pytest.approx(s * 2 / 3) for s in seconds]
    finally:
        await warmed.close()


async def test_cancelling_the_batch_stops_the_thread_and_the_cpu(small_path: Path) -> None:
    runtime = await _started(small_path, warmup=False)
    try:
        # 8 rows × 1000 decode steps: seconds of work if nobody stops it.
        items = _items(*[(f"prompt {i}", 1000) for i in range(8)])
        task = asyncio.ensure_future(runtime.execute(items))
        cpu0 = _process_cpu()
        await asyncio.sleep(0.4)
        busy = _process_cpu() - cpu0
        assert not task.done()
        assert busy > 0.1, f"the generation was not running ({busy:.3f} s CPU in 0.4 s)"

        cancelled_at = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The runtime's single thread takes the next job only once generate has returned.
        assert runtime._executor is not None
        await asyncio.wrap_future(runtime._executor.submit(lambda: None))
        stopped_after = time.perf_counter() - cancelled_at
        assert stopped_after < 0.25, f"the generation thread ran {stopped_after:.3f} s on"

        cpu1 = _process_cpu()
        await asyncio.sleep(0.5)
        idle = _process_cpu() - cpu1
        assert idle < 0.1, f"{idle:.3f} s of CPU spent in the 0.5 s after the cancel"

        # And the runtime still serves.
        result = await runtime.execute(_items(("after", 5)))
        assert result.outputs[0].output_tokens == 5
    finally:
        await runtime.close()


async def test_a_replica_frees_the_slot_when_the_caller_cancels(small_path: Path) -> None:
    runtime = await _started(small_path, warmup=False)
    slots = SlotTable(1, ManualClock())
    replica = Replica(runtime, slots)
    try:
        task = asyncio.ensure_future(replica.execute("b1", _items(("long", 1000))))
        await asyncio.sleep(0.1)
        assert slots.busy == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert slots.busy == 0
        result = await replica.execute("b2", _items(("short", 4)))
        assert result.outputs[0].output_tokens == 4
    finally:
        await runtime.close()


async def test_generate_runs_on_the_runtimes_thread(small_path: Path) -> None:
    # The engine blocks: it must run on the runtime's own thread, never on the event loop.
    runtime = await _started(small_path, warmup=False)
    names: list[str] = []
    try:
        engine = runtime.engine
        assert engine is not None
        real = engine.generate

        def spy(*args: object, **kwargs: object) -> list[bytes]:
            names.append(threading.current_thread().name)
            return real(*args, **kwargs)  # type: ignore[arg-type]

        engine.generate = spy  # type: ignore[method-assign]
        await runtime.execute(_items(("a", 2)))
    finally:
        await runtime.close()
    assert names and names[0].startswith("onnx-runtime")
    assert names[0] != threading.current_thread().name


def test_cost_fit_is_a_non_negative_line() -> None:
    fit = CostFit(forgetting=1.0)
    assert fit.estimate_s(100) > 0  # a prior before any batch
    fit.observe(100, 0.010)
    assert fit.estimate_s(100) == pytest.approx(0.010)  # one point: through the origin
    fit.observe(300, 0.020)
    assert fit.intercept_s == pytest.approx(0.005)
    assert fit.slope_s == pytest.approx(5e-5)
    falling = CostFit(forgetting=1.0)
    falling.observe(100, 0.030)
    falling.observe(300, 0.010)  # a negative slope is not a cost model: flat instead
    assert falling.slope_s == 0.0 and falling.intercept_s == pytest.approx(0.020)
    steep = CostFit(forgetting=1.0)
    steep.observe(100, 0.001)
    steep.observe(200, 0.010)  # a negative intercept: through the origin instead
    assert steep.intercept_s == 0.0 and steep.slope_s > 0
    forgetful = CostFit(forgetting=0.5)
    for _ in range(30):
        forgetful.observe(100, 0.010)
    for _ in range(30):
        forgetful.observe(100, 0.050)
    assert forgetful.estimate_s(100) == pytest.approx(0.050, rel=1e-3)
