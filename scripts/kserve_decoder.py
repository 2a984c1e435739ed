# mypy: ignore-errors
# (Runs in .tools/kserve, another virtualenv: kserve pins protobuf 6, which .venv cannot hold.)
"""A real Open Inference Protocol backend: KServe's model server around the generated decoder.

``make tools-kserve`` installs what it needs into ``.tools/kserve``; then::

    .tools/kserve/bin/python scripts/kserve_decoder.py --model-file PATH.onnx \\
        --model-name decoder --grpc-port 8081 [--http-port 8080]

serves the model ``decoder`` over KServe v2 gRPC (``inference.GRPCInferenceService``) on
127.0.0.1 — and, with ``--http-port``, the v2 REST API — so that ``halcyon worker --runtime
oip --backend 127.0.0.1:8081 --backend-model decoder`` can front it. It is what the OIP tests
run against, and a demonstration backend.

The model (a ``kserve.Model``) takes ``text_input`` BYTES ``[B, 1]`` and ``max_tokens`` INT32
``[B, 1]`` and answers ``text_output`` BYTES ``[B, 1]``: ONE
``worker.onnx_engine.DecoderEngine.generate`` call for the whole request (the batch stacked
along dimension 0), run in a thread so the server keeps answering readiness meanwhile. A
cancelled call (the client went away, its deadline passed) stops the generation within one
decode step and is logged as ``cancelled``.

Injected trouble, for tests:

* ``--max-concurrent K``: a ModelInfer arriving while K are in flight is refused with
  RESOURCE_EXHAUSTED (and, with ``--pushback-ms``, a ``grpc-retry-pushback-ms`` trailer) —
  the way a server with a full queue says "overloaded";
* ``--fail-rate P``: a fraction of requests fail with INTERNAL and a message naming the
  injected fault (a model raising ``grpc_interceptor.exceptions.Internal``: kserve's
  ExceptionToStatusInterceptor keeps the code and message of a GrpcException, while any
  other exception becomes INTERNAL "Internal server error");
* ``--delay-ms MS``: every request takes at least this long (a slow backend);
* ``--faults-after N``: ``--fail-rate`` and ``--delay-ms`` spare the first N requests (a
  worker's warm-up at start is 2), so a failing backend still lets a worker start;
* ``--directives``: a prompt beginning with ``#fail`` fails its request with INTERNAL, one
  beginning with ``#sleep=MS`` delays it by MS — so one server can play every part in a test.

How kserve maps a model's exceptions to gRPC codes (kserve.protocol.grpc.interceptors):
InferenceError, InvalidInput, UnsupportedProtocol -> INVALID_ARGUMENT; ServerNotReady,
ServerNotLive, ModelNotReady -> UNAVAILABLE; ModelNotFound -> NOT_FOUND; NotImplementedError
-> UNIMPLEMENTED; a grpc_interceptor GrpcException -> its own code and details; anything else
-> INTERNAL "Internal server error".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # worker.onnx_engine imports only numpy and onnxruntime

_log = logging.getLogger("kserve_decoder")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-file", required=True, help="the ONNX decoder to serve")
    parser.add_argument("--model-name", default="decoder", help="name on the server")
    parser.add_argument("--grpc-port", type=int, required=True, help="KServe v2 gRPC port")
    parser.add_argument(
        "--http-port", type=int, default=0, help="KServe v2 REST port (default 0: no REST)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--input-tensor", default="text_input")
    parser.add_argument("--max-tokens-tensor", default="max_tokens")
    parser.add_argument(
        "--max-tokens-datatype", default="INT32", help="declared datatype of max_tokens"
    )
    parser.add_argument("--output-tensor", default="text_output")
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=0,
        metavar="K",
        help="refuse a request with RESOURCE_EXHAUSTED while K are in flight (0: no limit)",
    )
    parser.add_argument(
        "--pushback-ms",
        type=int,
        default=-1,
        metavar="MS",
        help="with --max-concurrent: send a grpc-retry-pushback-ms trailer (default: none)",
    )
    parser.add_argument(
        "--fail-rate", type=float, default=0.0, help="fraction of requests failing INTERNAL"
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="minimum time per request")
    parser.add_argument(
        "--faults-after",
        type=int,
        default=0,
        metavar="N",
        help="--fail-rate and --delay-ms spare the first N requests (default 0)",
    )
    parser.add_argument(
        "--directives",
        action="store_true",
        help="obey #fail and #sleep=MS at the start of a prompt (for tests)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for --fail-rate")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # kserve.model_server parses sys.argv at import: hide ours from it.
    sys.argv = sys.argv[:1]
    import grpc
    import numpy as np
    from grpc_interceptor.exceptions import Internal, ResourceExhausted
    from kserve import Model
    from kserve.model_repository import ModelRepository
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
    from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
    from kserve.protocol.grpc.servicer import InferenceServicer
    from kserve.protocol.infer_type import InferOutput, InferResponse
    from kserve.protocol.model_repository_extension import ModelRepositoryExtension

    from worker.onnx_engine import DecoderEngine, GenerationCancelled

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rng = random.Random(args.seed)

    class DecoderModel(Model):
        """The generated byte-level decoder behind the v2 protocol: one batch per request."""

        def __init__(self) -> None:
            super().__init__(args.model_name)
            self.engine: DecoderEngine | None = None
            self.requests = 0

        def load(self) -> bool:
            self.engine = DecoderEngine(args.model_file, threads=args.threads)
            self.ready = True
            return self.ready

        def get_input_types(self) -> list[dict]:
            return [
                {"name": args.input_tensor, "datatype": "BYTES", "shape": [-1, 1]},
                {"name": args.max_tokens_tensor, "datatype": args.max_tokens_datatype,
                 "shape": [-1, 1]},
            ]  # fmt: skip

        def get_output_types(self) -> list[dict]:
            return [{"name": args.output_tensor, "datatype": "BYTES", "shape": [-1, 1]}]

        async def predict(self, payload, headers=None, response_headers=None):
            self.requests += 1
            started = time.monotonic()
            faulty = self.requests > args.faults_after
            if faulty and args.fail_rate > 0 and rng.random() < args.fail_rate:
                raise Internal(f"injected backend fault (request {self.requests})")
            inputs = {tensor.name: tensor for tensor in payload.inputs}
            try:
                prompts = [bytes(p) for p in inputs[args.input_tensor].as_numpy().reshape(-1)]
                budgets = [int(n) for n in inputs[args.max_tokens_tensor].as_numpy().reshape(-1)]
            except KeyError as exc:
                raise Internal(f"missing input tensor {exc}") from None
            delay_s = args.delay_ms / 1000.0 if faulty else 0.0
            if args.directives:
                for prompt in prompts:
                    if prompt.startswith(b"#fail"):
                        raise Internal(f"injected backend fault: {prompt[:40]!r}")
                    if prompt.startswith(b"#sleep="):
                        ms = prompt[len(b"#sleep=") :].split()[0]
                        delay_s = max(delay_s, float(ms) / 1000.0)
            stop = threading.Event()
            assert self.engine is not None
            try:
                texts = await asyncio.to_thread(self.engine.generate, prompts, budgets, stop.is_set)
                rest = delay_s - (time.monotonic() - started)
                if rest > 0:
                    await asyncio.sleep(rest)
            except asyncio.CancelledError:
                stop.set()
                _log.info("cancelled: request %s (%d items)", payload.id, len(prompts))
                raise
            except GenerationCancelled:
                raise Internal("generation cancelled") from None
            out = InferOutput(args.output_tensor, shape=[len(texts), 1], datatype="BYTES")
            out.set_data_from_numpy(np.array(texts, dtype=np.object_).reshape(-1, 1))
            _log.info("batch of %d in %.1f ms", len(prompts), (time.monotonic() - started) * 1000)
            return InferResponse(response_id=payload.id, model_name=self.name, infer_outputs=[out])

    class GuardedServicer(InferenceServicer):
        """KServe's servicer with a concurrency limit: overload is RESOURCE_EXHAUSTED."""

        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            self.inflight = 0

        async def ModelInfer(self, request, context):
            limit = args.max_concurrent
            if limit > 0 and self.inflight >= limit:
                if args.pushback_ms >= 0:
                    context.set_trailing_metadata(
                        (("grpc-retry-pushback-ms", str(args.pushback_ms)),)
                    )
                _log.info("overloaded: %d in flight", self.inflight)
                raise ResourceExhausted(
                    f"server overloaded: {self.inflight} requests in flight, limit {limit}"
                )
            self.inflight += 1
            try:
                return await super().ModelInfer(request, context)
            finally:
                self.inflight -= 1

    model = DecoderModel()
    model.load()
    registry = ModelRepository()
    registry.update(model)
    dataplane = DataPlane(model_registry=registry)
    extension = ModelRepositoryExtension(model_registry=registry)

    async def serve() -> None:
        server = grpc.aio.server(
            interceptors=(ExceptionToStatusInterceptor(),),
            options=[("grpc.so_reuseport", 0)],
        )
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            GuardedServicer(dataplane, extension), server
        )
        port = server.add_insecure_port(f"{args.host}:{args.grpc_port}")
        await server.start()
        tasks = [asyncio.ensure_future(server.wait_for_termination())]
        if args.http_port:
            from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
            from kserve.protocol.rest.server import RESTServer

            rest = RESTServer(FASTAPI_APP_IMPORT_STRING, dataplane, extension, args.http_port)
            rest.config.host = args.host  # kserve binds 0.0.0.0; we stay on loopback
            tasks.append(asyncio.ensure_future(rest.start()))
        _log.info(
            "serving %s (%s) on grpc %s:%d%s", args.model_name, args.model_file, args.host,
            port, f", http {args.host}:{args.http_port}" if args.http_port else "",
        )  # fmt: skip
        await asyncio.gather(*tasks)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
