"""A remote model server as the worker's runtime, over the Open Inference Protocol.

What it decides: how a batch becomes ONE ``inference.GRPCInferenceService/ModelInfer`` call
to a KServe v2 gRPC backend (Triton, KServe, MLServer, OpenVINO Model Server), how the
backend's answers and failures map onto the worker's contract, and what "ready" means for a
runtime the worker does not own.

* **start** opens a channel (:func:`backend_channel_options`), waits at most
  ``start_timeout_s`` for ServerReady and ModelReady (progress logged every few seconds),
  checks ModelMetadata for the configured tensors (a BYTES text input, an INT32 max-tokens
  input, a BYTES text output), then runs two warm-up batches (1 item, then 8) kept in
  :attr:`OipRuntime.warmup_samples`. Anything wrong raises
  :class:`~worker.runtime.RuntimeStartError` with one line naming the cause.
* **a batch** is stacked along dimension 0: ``text_input`` BYTES ``[B, 1]``, ``max_tokens``
  INT32 ``[B, 1]`` in, ``text_output`` BYTES ``[B, 1]`` out (Triton's vLLM and TensorRT-LLM
  backends' names are the defaults). Inputs go as ``raw_input_contents`` (BYTES elements
  4-byte little-endian length-prefixed, INT32 little-endian); outputs are read from
  ``raw_output_contents`` or from the typed ``contents.bytes_contents``, whichever the
  backend used. A model whose metadata declares rank-1 tensors gets ``[B]`` instead.
* **output tokens**: the protocol has no token count, so an item's ``output_tokens`` is the
  backend's optional ``output_tokens`` INT32/INT64 output when the model has one, else
  ``min(max_tokens, len(output bytes))`` — exact for byte-level models, an upper bound capped
  by the budget for others. The text is the output bytes decoded as UTF-8
  (``errors="replace"``).
* **cancellation and deadlines**: cancelling the batch task cancels the in-flight grpc.aio
  call, and the backend sees a cancelled RPC (the gateway's deadline and hedge cancellations
  reach it this way); ``call_timeout_s`` bounds a call whose caller never goes away.
* **errors**: RESOURCE_EXHAUSTED, and UNAVAILABLE answered by a backend that is still
  connected, are overload — :class:`~worker.runtime.RuntimeBusy` with a computed retry delay
  (the ``grpc-retry-pushback-ms`` trailer if sent, else the recent batch time). UNAVAILABLE
  because the connection dropped or cannot be made (a crashed backend) and every other code
  are :class:`~worker.runtime.DeviceFault` ``"backend <CODE>: <message>"``: the gateway
  retries the batch elsewhere and its breaker counts it.
* **readiness** follows the backend: a background task asks ServerReady and ModelReady every
  ``readiness_interval_s``; :meth:`OipRuntime.ready` is the last answer (False on an error or
  a timeout), and a batch that loses its connection asks again at once.
* **estimate_s** is an online least-squares line ``seconds ≈ a + b · batch tokens`` over
  recent batches, seeded by the warm-ups.

Faults from the :class:`~worker.faults.FaultInjector` work as on the simulated device: FAIL
fails fast, HANG waits for cancellation (sending nothing), a slowdown stretches each batch.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from common import keepalive
from common.clock import Clock
from halcyon.oip import grpc_predict_v2_pb2 as pb
from halcyon.oip import grpc_predict_v2_pb2_grpc as pb_grpc
from worker.faults import FaultInjector, FaultKind
from worker.runtime import (
    CostSampleValue,
    DeviceFault,
    ItemOutput,
    RuntimeBusy,
    RuntimeResult,
    RuntimeStartError,
    WorkItem,
    batch_tokens,
    samples_from_tuples,
)
from worker.runtime_options import OipOptions

__all__ = [
    "OUTPUT_TOKENS_TENSOR",
    "OipRuntime",
    "OnlineCost",
    "WarmupSample",
    "backend_channel_options",
    "decode_bytes_tensor",
    "encode_bytes_tensor",
    "encode_int32_tensor",
]

_log = logging.getLogger("halcyon.worker.oip")

OUTPUT_TOKENS_TENSOR = "output_tokens"  # optional INT32/INT64 output: tokens per item
PUSHBACK_TRAILER = "grpc-retry-pushback-ms"
_PROBE_TIMEOUT_S = 2.0
_PROGRESS_EVERY_S = 5.0
_WARMUP_PROMPT = "warm-up"
_WARMUP_TOKENS = 8
_MIN_RETRY_S = 0.005
_MAX_RETRY_S = 5.0
# What gRPC's own transport says when there is no connection to the backend (as opposed to
# an UNAVAILABLE the backend itself answered): a crashed or unreachable backend is a fault.
_TRANSPORT_PHRASES = (
    "failed to connect",
    "connection refused",
    "connection reset",
    "socket closed",
    "broken pipe",
    "goaway",
    "connection lost",
    "connection aborted",
    "keepalive",
    "endpoint closing",
    "stream removed",
    "dns resolution failed",
    "network is unreachable",
)


def backend_channel_options() -> list[tuple[str, int]]:
    """Channel options for a channel to an OIP backend.

    Keepalive pings at the fleet's interval, as a server with gRPC's default ping policy
    accepts them (:func:`common.keepalive.backend_client_options`: at most two per quiet
    spell, none on an idle connection — a stricter backend would answer faster pings during a
    long batch with GOAWAY too_many_pings), so a backend that vanished without closing its
    connections is noticed; reconnection attempts start after 100 ms and
    back off to at most 1 s, so a restarted backend is reached within about a second; no
    transparent retries (the gateway retries batches, elsewhere); room for large batches.
    """
    return [
        *keepalive.backend_client_options(),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1_000),
        ("grpc.enable_retries", 0),
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20),
    ]


# -- the wire format of tensors ------------------------------------------------------------


def encode_bytes_tensor(elements: Iterable[bytes]) -> bytes:
    """BYTES elements as raw contents: each one 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def encode_int32_tensor(values: Iterable[int]) -> bytes:
    """INT32 elements as raw contents: little-endian, no padding."""
    items = list(values)
    return struct.pack(f"<{len(items)}i", *items)


def decode_bytes_tensor(raw: bytes) -> list[bytes]:
    """The BYTES elements of raw contents (raises ValueError on a truncated buffer)."""
    out: list[bytes] = []
    view = memoryview(raw)
    at = 0
    while at < len(view):
        if at + 4 > len(view):
            raise ValueError(f"truncated BYTES tensor: {len(view) - at} bytes left for a length")
        (size,) = struct.unpack_from("<I", view, at)
        at += 4
        if at + size > len(view):
            raise ValueError(f"truncated BYTES tensor: element of {size} bytes past the end")
        out.append(bytes(view[at : at + size]))
        at += size
    return out


def _decode_int_tensor(datatype: str, raw: bytes) -> list[int]:
    fmt = {"INT32": "i", "INT64": "q", "UINT32": "I", "UINT64": "Q"}.get(datatype)
    if fmt is None:
        raise ValueError(f"not an integer datatype: {datatype}")
    count = len(raw) // struct.calcsize(fmt)
    return list(struct.unpack(f"<{count}{fmt}", raw[: count * struct.calcsize(fmt)]))


# -- the cost model ------------------------------------------------------------------------


class OnlineCost:
    """``seconds ≈ a + b · tokens`` fitted by exponentially weighted least squares.

    Each observation keeps weight ``(1 - alpha)^k`` after ``k`` newer ones, so the line
    follows a backend whose speed changes. With one distinct batch size seen the slope is
    the mean time per token (no intercept); ``a`` and ``b`` are never negative.
    """

    def __init__(self, alpha: float = 0.05) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self._alpha = alpha
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.observations = 0

    def observe(self, tokens: int, seconds: float) -> None:
        keep = 1.0 - self._alpha
        x, y = float(tokens), max(0.0, seconds)
        self._w = self._w * keep + 1.0
        self._sx = self._sx * keep + x
        self._sy = self._sy * keep + y
        self._sxx = self._sxx * keep + x * x
        self._sxy = self._sxy * keep + x * y
        self.observations += 1

    def line(self) -> tuple[float, float]:
        """``(intercept_s, seconds_per_token)``; ``(0, 0)`` before any observation."""
        if self._w <= 0:
            return 0.0, 0.0
        mx, my = self._sx / self._w, self._sy / self._w
        var = self._sxx / self._w - mx * mx
        if var > 1e-9 * max(1.0, mx * mx):
            slope = (self._sxy / self._w - mx * my) / var
            intercept = my - slope * mx
            if slope >= 0 and intercept >= 0:
                return intercept, slope
            if slope < 0:  # bigger batches were no slower: a flat cost
                return my, 0.0
        # One batch size (or a negative intercept): proportional through the origin.
        return 0.0, (self._sxy / self._sxx if self._sxx > 0 else 0.0)

    def estimate(self, tokens: int) -> float:
        a, b = self.line()
        return a + b * tokens


# -- the runtime ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WarmupSample:
    """One warm-up batch: how big it was and how long the backend took."""

    items: int
    batch_tokens: int
    longest_output: int
    seconds: float


@dataclass(frozen=True)
class _Tensor:
    name: str
    datatype: str
    rank: int  # 0 when the metadata gave no shape


def _never() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


class OipRuntime:
    """A batch is one ModelInfer on a remote Open Inference Protocol backend."""

    kind = "oip"

    def __init__(
        self,
        options: OipOptions,
        *,
        clock: Clock,
        faults: FaultInjector | None = None,
    ) -> None:
        if options.start_timeout_s <= 0 or options.call_timeout_s <= 0:
            raise ValueError("start_timeout_s and call_timeout_s must be > 0")
        if options.readiness_interval_s <= 0:
            raise ValueError("readiness_interval_s must be > 0")
        self.options = options
        self._clock = clock
        self._faults = faults
        self.start_timeout_s = options.start_timeout_s
        self.call_timeout_s = options.call_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.GRPCInferenceServiceStub | None = None
        self._ready = False
        self._poll_task: asyncio.Task[None] | None = None
        self._probe_now = asyncio.Event()
        self._input: _Tensor | None = None
        self._max_tokens: _Tensor | None = None
        self._output: _Tensor | None = None
        self._has_token_output = False
        self._cost = OnlineCost()
        self._recent_s: float | None = None  # EWMA of batch wall time, for retry advice
        self.warmup_samples: list[tuple[int, int, int, float]] = []
        self.backend_name = ""  # ServerMetadata's name and version, for operators
        self.readiness_changes = 0

    @property
    def target(self) -> str:
        model = self.options.backend_model
        if self.options.backend_version:
            model += f"@{self.options.backend_version}"
        return f"{model} on {self.options.backend}"

    # -- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._channel = grpc.aio.insecure_channel(
            self.options.backend, options=backend_channel_options()
        )
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        try:
            await self._wait_backend_ready()
            await self._check_metadata()
            await self._warm_up()
        except BaseException:
            await self.close()
            raise
        self._ready = True
        self._poll_task = asyncio.get_running_loop().create_task(
            self._poll_readiness(), name="oip-readiness"
        )

    def ready(self) -> bool:
        return self._ready

    async def close(self) -> None:
        task, self._poll_task = self._poll_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._ready = False
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    def estimate_s(self, batch_tokens: int) -> float:
        return self._cost.estimate(batch_tokens)

    async def warm_up(self) -> tuple[CostSampleValue, ...]:
        """The warm-up batches :meth:`start` ran on the backend (no injected faults)."""
        return samples_from_tuples(self.warmup_samples)

    # -- start: readiness, contract, warm-up -----------------------------------------------

    async def _probe(self, timeout_s: float) -> str | None:
        """None when the server and the model are ready, else why not (one phrase)."""
        assert self._stub is not None
        server = await self._stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout_s)
        if not server.ready:
            return "the server is not ready"
        model = await self._stub.ModelReady(
            pb.ModelReadyRequest(
                name=self.options.backend_model, version=self.options.backend_version
            ),
            timeout=timeout_s,
        )
        if not model.ready:
            return f"model {self.options.backend_model!r} is not ready"
        return None

    async def _wait_backend_ready(self) -> None:
        started = self._clock.now()
        deadline = started + self.start_timeout_s
        next_progress = started + _PROGRESS_EVERY_S
        why = "no answer yet"
        _log.info("waiting for the OIP backend", extra={"backend": self.target})
        while True:
            remaining = deadline - self._clock.now()
            if remaining <= 0:
                raise RuntimeStartError(
                    f"OIP backend {self.options.backend} not ready for model "
                    f"{self.options.backend_model!r} after {self.start_timeout_s:g} s: {why} "
                    "(check --backend and --backend-model)"
                )
            try:
                reason = await self._probe(min(_PROBE_TIMEOUT_S, max(0.05, remaining)))
            except grpc.aio.AioRpcError as err:
                code = err.code()
                if code in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.UNIMPLEMENTED,
                ):
                    raise RuntimeStartError(
                        f"OIP backend {self.options.backend} refused the readiness check: "
                        f"{code.name}: {_one_line(err.details())}"
                    ) from None
                why = f"{code.name}: {_one_line(err.details())}"
            else:
                if reason is None:
                    break
                why = reason
            now = self._clock.now()
            if now >= next_progress:
                _log.info(
                    "still waiting for the OIP backend",
                    extra={
                        "backend": self.target,
                        "waited_s": round(now - started, 1),
                        "timeout_s": self.start_timeout_s,
                        "last": why,
                    },
                )
                next_progress = now + _PROGRESS_EVERY_S
            await asyncio.sleep(min(0.2, max(0.0, deadline - self._clock.now())))
        _log.info(
            "OIP backend ready",
            extra={"backend": self.target, "waited_s": round(self._clock.now() - started, 3)},
        )

    async def _check_metadata(self) -> None:
        assert self._stub is not None
        opts = self.options
        try:
            server = await self._stub.ServerMetadata(
                pb.ServerMetadataRequest(), timeout=_PROBE_TIMEOUT_S
            )
            self.backend_name = f"{server.name} {server.version}".strip()
        except grpc.aio.AioRpcError:
            self.backend_name = ""  # optional: not every server answers it usefully
        try:
            meta = await self._stub.ModelMetadata(
                pb.ModelMetadataRequest(name=opts.backend_model, version=opts.backend_version),
                timeout=_PROBE_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as err:
            raise RuntimeStartError(
                f"OIP backend {opts.backend}: ModelMetadata for {opts.backend_model!r} failed: "
                f"{err.code().name}: {_one_line(err.details())}"
            ) from None
        inputs = {t.name: t for t in meta.inputs}
        outputs = {t.name: t for t in meta.outputs}
        model = meta.name or opts.backend_model
        self._input = _require(model, "input", inputs, opts.input_name, "BYTES", "--input-tensor")
        self._max_tokens = _require(
            model, "input", inputs, opts.max_tokens_name, "INT32", "--max-tokens-tensor"
        )
        self._output = _require(
            model, "output", outputs, opts.output_name, "BYTES", "--output-tensor"
        )
        tokens = outputs.get(OUTPUT_TOKENS_TENSOR)
        self._has_token_output = tokens is not None and tokens.datatype in ("INT32", "INT64")
        _log.info(
            "OIP backend model checked",
            extra={
                "backend": self.target,
                "server": self.backend_name,
                "platform": meta.platform,
                "input": f"{self._input.name} {self._input.datatype}",
                "max_tokens": f"{self._max_tokens.name} {self._max_tokens.datatype}",
                "output": f"{self._output.name} {self._output.datatype}",
                "token_counts": OUTPUT_TOKENS_TENSOR if self._has_token_output else "bytes",
            },
        )

    async def _warm_up(self) -> None:
        for size in (1, 8):
            items = [
                WorkItem(f"warmup-{size}-{i}", _WARMUP_PROMPT, len(_WARMUP_PROMPT), _WARMUP_TOKENS)
                for i in range(size)
            ]
            started = self._clock.now()
            try:
                result = await self._infer(items, timeout_s=self.start_timeout_s)
            except (DeviceFault, RuntimeBusy) as exc:
                raise RuntimeStartError(
                    f"OIP backend {self.options.backend}: warm-up batch of {size} failed: {exc}"
                ) from None
            seconds = self._clock.now() - started
            longest = max(item.max_output_tokens for item in items)  # the longest budget
            self.warmup_samples.append((size, result.batch_tokens, longest, seconds))
            self._observe(result.batch_tokens, seconds)
        _log.info(
            "OIP backend warmed up",
            extra={
                "backend": self.target,
                "samples": [
                    {"items": n, "tokens": t, "longest_output": o, "ms": round(s * 1000, 2)}
                    for n, t, o, s in self.warmup_samples
                ],
            },
        )

    # -- readiness -------------------------------------------------------------------------

    async def _poll_readiness(self) -> None:
        interval = self.options.readiness_interval_s
        while True:
            try:
                reason = await self._probe(max(_PROBE_TIMEOUT_S, interval))
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as err:
                reason = f"{err.code().name}: {_one_line(err.details())}"
            except Exception as err:  # never let the poller die: it is the readiness
                reason = repr(err)
            self._set_ready(reason)
            self._probe_now.clear()
            # The next probe after the interval, or at once when a batch lost its connection.
            # (asyncio.wait, not wait_for: 3.11's wait_for can swallow a cancellation.)
            nudged = asyncio.ensure_future(self._probe_now.wait())
            try:
                await asyncio.wait((nudged,), timeout=interval)
            finally:
                nudged.cancel()

    def _set_ready(self, reason: str | None) -> None:
        ready = reason is None
        if ready == self._ready:
            return
        self._ready = ready
        self.readiness_changes += 1
        if ready:
            _log.info("OIP backend ready again", extra={"backend": self.target})
        else:
            _log.warning("OIP backend not ready", extra={"backend": self.target, "why": reason})

    # -- batches ---------------------------------------------------------------------------

    async def execute(self, items: Sequence[WorkItem]) -> RuntimeResult:
        plan = self._faults.plan() if self._faults is not None else None
        if plan is not None and plan.kind is FaultKind.FAIL:
            await asyncio.sleep(plan.fail_after_s)
            raise DeviceFault("injected device fault")
        if plan is not None and plan.kind is FaultKind.HANG:
            await _never()
        started = self._clock.now()
        result = await self._infer(items, timeout_s=self.call_timeout_s)
        elapsed = self._clock.now() - started
        if plan is not None and plan.slowdown > 1.0:
            await asyncio.sleep(elapsed * (plan.slowdown - 1.0))
        seconds = self._clock.now() - started
        self._observe(result.batch_tokens, seconds)
        return RuntimeResult(result.outputs, seconds, result.batch_tokens)

    def _observe(self, tokens: int, seconds: float) -> None:
        self._cost.observe(tokens, seconds)
        self._recent_s = seconds if self._recent_s is None else 0.8 * self._recent_s + 0.2 * seconds

    def _request(self, items: Sequence[WorkItem]) -> pb.ModelInferRequest:
        assert self._input is not None and self._max_tokens is not None
        assert self._output is not None
        n = len(items)
        request = pb.ModelInferRequest(
            model_name=self.options.backend_model, model_version=self.options.backend_version
        )
        request.inputs.add(name=self._input.name, datatype="BYTES", shape=_shape(self._input, n))
        request.inputs.add(
            name=self._max_tokens.name, datatype="INT32", shape=_shape(self._max_tokens, n)
        )
        request.raw_input_contents.append(
            encode_bytes_tensor(item.input.encode("utf-8") for item in items)
        )
        request.raw_input_contents.append(
            encode_int32_tensor(item.max_output_tokens for item in items)
        )
        request.outputs.add(name=self._output.name)
        if self._has_token_output:
            request.outputs.add(name=OUTPUT_TOKENS_TENSOR)
        return request

    async def _infer(self, items: Sequence[WorkItem], *, timeout_s: float) -> RuntimeResult:
        assert self._stub is not None
        request = self._request(items)
        started = self._clock.now()
        call = self._stub.ModelInfer(request, timeout=timeout_s)
        try:
            response = await call
        except grpc.aio.AioRpcError as err:
            raise self._map_error(err) from None
        texts, counts = self._parse(response, len(items))
        outputs = tuple(
            ItemOutput(
                id=item.id,
                output=text.decode("utf-8", errors="replace"),
                input_tokens=item.input_tokens,
                output_tokens=(
                    max(0, counts[i])
                    if counts is not None
                    else min(item.max_output_tokens, len(text))
                ),
            )
            for i, (item, text) in enumerate(zip(items, texts, strict=True))
        )
        return RuntimeResult(outputs, self._clock.now() - started, batch_tokens(items))

    def _parse(
        self, response: pb.ModelInferResponse, n: int
    ) -> tuple[list[bytes], list[int] | None]:
        assert self._output is not None
        raw = list(response.raw_output_contents)
        texts: list[bytes] | None = None
        counts: list[int] | None = None
        for index, tensor in enumerate(response.outputs):
            if tensor.name == self._output.name:
                try:
                    if raw:
                        texts = decode_bytes_tensor(raw[index])
                    else:
                        texts = list(tensor.contents.bytes_contents)
                except (ValueError, IndexError) as exc:
                    raise DeviceFault(f"backend sent a malformed {tensor.name!r}: {exc}") from None
            elif tensor.name == OUTPUT_TOKENS_TENSOR and self._has_token_output:
                if raw and index < len(raw):
                    counts = _decode_int_tensor(tensor.datatype, raw[index])
                elif tensor.datatype == "INT64":
                    counts = list(tensor.contents.int64_contents)
                else:
                    counts = list(tensor.contents.int_contents)
        if texts is None:
            names = ", ".join(t.name for t in response.outputs) or "none"
            raise DeviceFault(
                f"backend answered without output {self._output.name!r} (outputs: {names})"
            )
        if len(texts) != n:
            raise DeviceFault(
                f"backend returned {len(texts)} {self._output.name!r} elements for a batch of {n}"
            )
        if counts is not None and len(counts) != n:
            counts = None  # not per item: fall back to counting bytes
        return texts, counts

    def _map_error(self, err: grpc.aio.AioRpcError) -> Exception:
        code = err.code()
        details = _one_line(err.details() or "")
        message = f"backend {code.name}: {details}" if details else f"backend {code.name}"
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED or (
            code is grpc.StatusCode.UNAVAILABLE and self._answered_by_backend(details)
        ):
            return RuntimeBusy(message, self._retry_after_s(_trailers(err)))
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            self._probe_now.set()  # the backend may be gone: ask now, not at the next tick
        return DeviceFault(message)

    def _answered_by_backend(self, details: str) -> bool:
        """Whether an UNAVAILABLE came from the backend itself (overloaded, queue full) rather
        than from a connection that dropped or could not be made (a crash): the transport's
        own words say the latter, and so does a channel that is no longer connected."""
        lowered = details.lower()
        if any(phrase in lowered for phrase in _TRANSPORT_PHRASES):
            return False
        if self._channel is None:
            return False
        return self._channel.get_state(try_to_connect=False) is grpc.ChannelConnectivity.READY

    def _retry_after_s(self, trailers: Sequence[tuple[str, Any]]) -> float:
        for key, value in trailers:
            if key.lower() == PUSHBACK_TRAILER:
                try:
                    ms = int(value.decode() if isinstance(value, bytes) else value)
                except ValueError:
                    break
                if ms >= 0:
                    return max(_MIN_RETRY_S, ms / 1000.0)
        recent = self._recent_s if self._recent_s is not None else self._cost.estimate(0)
        return min(_MAX_RETRY_S, max(_MIN_RETRY_S, recent))


def _shape(tensor: _Tensor, n: int) -> list[int]:
    return [n] if tensor.rank == 1 else [n, 1]


def _require(
    model: str,
    kind: str,
    tensors: dict[str, Any],
    name: str,
    datatype: str,
    flag: str,
) -> _Tensor:
    """The named tensor of the backend's model metadata, or a one-line RuntimeStartError."""
    found = tensors.get(name)
    if found is None:
        listed = ", ".join(f"{t.name} {t.datatype}" for t in tensors.values()) or "none"
        raise RuntimeStartError(
            f"backend model {model!r} has no {kind} tensor {name!r} (its {kind}s: {listed}); "
            f"set {flag}"
        )
    if found.datatype != datatype:
        raise RuntimeStartError(
            f"backend model {model!r} {kind} tensor {name!r} is {found.datatype or 'untyped'}, "
            f"expected {datatype}"
        )
    return _Tensor(found.name, found.datatype, len(found.shape))


def _trailers(err: grpc.aio.AioRpcError) -> Sequence[tuple[str, Any]]:
    try:
        metadata = err.trailing_metadata()
    except Exception:
        return ()
    return tuple(metadata or ())


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())
