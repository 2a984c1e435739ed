"""Server CPU per bare unary call on each serving path (ADR 0006, ADR 0010).

Starts a ``ServiceHost`` with one echo method in a child process, on ``--serving-path`` fast
(the completion-queue endpoint) or aio (``grpc.aio``), drives it from this process with
``--concurrency`` calls in flight, and prints the child's CPU time (user + system, from
``/proc``) per call over ``--calls`` calls after a warm-up. Linux only; loopback only.

    .venv/bin/python scripts/bare_call_cost.py --path fast
    .venv/bin/python scripts/bare_call_cost.py --path aio
    .venv/bin/python scripts/bare_call_cost.py --path aio --decode

The method is added with ``ServiceHost.add_unary``, so either path runs it behind the host's
unary pipeline (``common.pipeline``: tracing, metrics, stop gate, decode). ``--decode`` gives
the method a protobuf request deserializer, as every real method has, so decoding the request
is in the figure (on either path). Tracing is configured from the environment as in every
server process: with no exporter configured, the pipeline makes no spans (``spans_recorded``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
import grpc.aio
from google.protobuf.wrappers_pb2 import BytesValue

METHOD = "/halcyon.bench.Echo/Call"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _serve(path: str, decode: bool) -> None:
    from common.call import UnaryCall
    from common.serving import ServiceHost, ServingOptions
    from common.tracing import configure_tracing

    # As every server process does: with no exporter configured (none here) no span is made.
    configure_tracing("bench")

    def echo(_request: Any, call: UnaryCall) -> None:
        call.reply(call.request)

    host = ServiceHost("bench", ServingOptions(metrics_listen=None, serving_path=path), None)
    host.add_unary(METHOD, echo, deserializer=BytesValue.FromString if decode else None)
    await host.start()
    print(host.grpc_address, host.serving_path, flush=True)
    await host.serve_until_signal()


async def _drive(address: str, calls: int, concurrency: int) -> float:
    body = BytesValue(value=b"x" * 62).SerializeToString()  # 64 bytes, either way
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(METHOD)
        left = calls

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await call(body, timeout=10)

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=("fast", "aio"), default="fast", help="(default fast)")
    parser.add_argument("--calls", type=int, default=20000, help="measured calls (default 20000)")
    parser.add_argument("--concurrency", type=int, default=64, help="in flight (default 64)")
    parser.add_argument(
        "--decode",
        action="store_true",
        help="the method decodes its request as a protobuf message (default: raw bytes)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.path, args.decode))
        return 0
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--path", args.path]
        + (["--decode"] if args.decode else []),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        address, served_by = child.stdout.readline().split()
        asyncio.run(_drive(address, 2000, args.concurrency))  # warm-up
        before = _cpu_seconds(child.pid)
        wall = asyncio.run(_drive(address, args.calls, args.concurrency))
        cpu = _cpu_seconds(child.pid) - before
    finally:
        child.terminate()
        child.wait(10)
    print(
        f"path={served_by}{' decode' if args.decode else ''} calls={args.calls} "
        f"concurrency={args.concurrency} "
        f"server_cpu_per_call={cpu / args.calls * 1000:.3f} ms calls_per_s={args.calls / wall:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
