"""The completion-queue path's safety, shown on real ``halcyon`` processes (ADR 0010).

Each server runs through ``fault_harness.py``: the real command with a fault hook in its pump
that a client triggers per call. What is shown:

* a fault in the pump fails only the call it was handling (INTERNAL + ErrorInfo) and the
  others, then and later, succeed;
* a wedged data path turns liveness (and readiness) NOT_SERVING on the probe port, answered
  while the loop is stuck, and SERVING again once it runs;
* a pump that cannot go on stops the process (exit 1, an ERROR line) and no call waits for its
  deadline;
* a grpcio release the fast path was not verified on, or ``--serving-path aio``, serves through
  grpc.aio with one log line saying why;
* SIGTERM on the fast path exits 0 with no abort in gRPC core, even after a pump fault.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.errors import Reason, parse_rpc_error
from halcyon.v1 import infer_pb2, infer_pb2_grpc, worker_pb2, worker_pb2_grpc

pytestmark = pytest.mark.e2e

HARNESS = Path(__file__).with_name("fault_harness.py")
FAULT_KEY = "x-halcyon-test-fault"
FLEET_TOKEN = "fast-path-fleet-token"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# What gRPC core prints when it aborts the process (a failed CHECK, an abort signal).
CORE_ABORT = re.compile(r"Check failed|Check failure|Aborted|SIGABRT|assertion", re.IGNORECASE)
INSTANT = ("--intercept-ms", "0", "--ms-per-token", "0", "--jitter", "0")


class Server:
    """One harnessed ``halcyon`` process on 127.0.0.1:0, its log in ``workdir``."""

    def __init__(self, workdir: Path, name: str, argv: list[str], pre: list[str]) -> None:
        self.name = name
        self.ready_file = workdir / f"{name}.json"
        self.log_file = workdir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
        env |= {"HALCYON_FLEET_TOKEN": FLEET_TOKEN, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, str(HARNESS), *pre, *argv]
        command += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
        command += ["--ready-file", str(self.ready_file), "--shutdown-grace", "2"]
        with open(self.log_file, "wb") as log:
            self.popen = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self.info = self._wait_ready()
        self.channel = grpc.insecure_channel(self.info["grpc"])

    def _wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        while not self.ready_file.exists():
            assert self.popen.poll() is None, f"{self.name} exited: {self.log()}"
            assert time.monotonic() < deadline, f"{self.name} not ready: {self.log()}"
            time.sleep(0.02)
        return dict(json.loads(self.ready_file.read_text()))

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def log_lines(self, pattern: str) -> list[str]:
        return [line for line in self.log().splitlines() if re.search(pattern, line)]

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.info['metrics']}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def health(self, name: str, address: str | None = None) -> int:
        with grpc.insecure_channel(address or self.info["grpc"]) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return int(stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=1).status)

    def wait_exit(self, timeout_s: float) -> int:
        return self.popen.wait(timeout=timeout_s)

    def close(self) -> None:
        self.channel.close()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=8)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


Start = Callable[..., Server]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    servers: list[Server] = []

    def make(command: str, *args: str, pre: tuple[str, ...] = ()) -> Server:
        argv = [command, *args]
        if command == "worker":
            argv += [*INSTANT, "--slots", "64"]
        server = Server(tmp_path, f"{command}-{len(servers)}", argv, list(pre))
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def _batch(server: Server, fault: str | None = None, timeout: float = 10.0) -> Future[Any]:
    stub = worker_pb2_grpc.WorkerServiceStub(server.channel)
    request = worker_pb2.ExecuteBatchRequest(
        batch_id="b",
        model="llama-3-8b",
        version="v1",
        items=[worker_pb2.BatchItem(id="a", input="hi", input_tokens=8, max_output_tokens=4)],
    )
    metadata = [("authorization", f"Bearer {FLEET_TOKEN}")]
    if fault is not None:
        metadata.append((FAULT_KEY, fault))
    future: Future[Any] = stub.ExecuteBatch.future(request, metadata=metadata, timeout=timeout)
    return future


def _outcome(future: Future[Any]) -> str:
    try:
        future.result()
    except grpc.RpcError as err:
        return str(err.code().name)
    return "OK"


def test_a_pump_fault_fails_only_its_call(start: Start) -> None:
    worker = start("worker", "--serving-path", "fast")
    before = [_batch(worker) for _ in range(16)]
    faulted = _batch(worker, fault="raise")
    after = [_batch(worker) for _ in range(16)]

    with pytest.raises(grpc.RpcError) as caught:
        faulted.result()
    err = parse_rpc_error(caught.value)  # type: ignore[arg-type]
    assert err.code == grpc.StatusCode.INTERNAL and err.reason == Reason.INTERNAL
    assert [_outcome(f) for f in before + after] == ["OK"] * 32
    assert [_outcome(_batch(worker)) for _ in range(8)] == ["OK"] * 8
    assert worker.health("liveness") == SERVING
    assert 'halcyon_serving_path_info{path="fast"} 1.0' in worker.metrics()
    assert len(worker.log_lines("handling an event failed")) == 1


def test_a_wedged_data_path_turns_liveness_off_then_on(start: Start) -> None:
    worker = start(
        "worker", "--health-listen", "127.0.0.1:0", "--stall-limit", "0.5", "--serving-path", "fast"
    )
    probe = worker.info["health"]
    assert worker.health("liveness", probe) == SERVING
    assert worker.health("readiness", probe) == SERVING
    wedged = _batch(worker, fault="wedge:4", timeout=20)
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 15
    # The probe port answers from gRPC's threads while the loop is stuck in the pump.
    while time.monotonic() < deadline:
        seen.append((worker.health("liveness", probe), worker.health("readiness", probe)))
        if (NOT_SERVING, NOT_SERVING) in seen and seen[-1] == (SERVING, SERVING):
            break
        time.sleep(0.05)
    assert (NOT_SERVING, NOT_SERVING) in seen, seen
    assert seen[-1] == (SERVING, SERVING), seen
    assert _outcome(wedged) == "OK"  # a slow answer, not a failed one
    # Either judgement may see it first: the loop ran nothing, or the queue it held was not
    # pumped.
    reasons = "the event loop has run nothing|ExecuteBatch: calls waiting on the completion queue"
    assert len(worker.log_lines(f"liveness NOT_SERVING: ({reasons})")) == 1
    assert worker.log_lines("liveness SERVING again")


def test_a_pump_that_cannot_go_on_stops_the_process_and_no_call_waits(start: Start) -> None:
    worker = start("worker", "--serving-path", "fast")
    assert _outcome(_batch(worker, fault="kill-poller")) == "OK"
    # The poller dies taking the next event it gets; while the loop is busy it takes events
    # itself, so call until one reaches the poller.
    give_up = time.monotonic() + 20
    while True:
        time.sleep(0.2)
        began = time.monotonic()
        code = _outcome(_batch(worker, timeout=30))
        if code != "OK" or time.monotonic() > give_up:
            break
    assert time.monotonic() - began < 10, "the call waited for its deadline"
    assert code in ("UNAVAILABLE", "CANCELLED"), code
    assert worker.wait_exit(15) == 1
    assert len(worker.log_lines('"level": "ERROR".*cannot go on')) == 1
    assert not CORE_ABORT.search(worker.log()), worker.log()


@pytest.mark.parametrize(
    ("pre", "flags", "level", "why"),
    [
        (("--pretend-grpcio", "1.99.0"), (), "WARNING", "grpcio 1.99.0 is not a release"),
        ((), ("--serving-path", "aio"), "INFO", "--serving-path aio"),
    ],
    ids=["unverified-grpcio", "forced"],
)
def test_grpc_aio_serves_with_one_line_saying_why(
    start: Start, pre: tuple[str, ...], flags: tuple[str, ...], level: str, why: str
) -> None:
    worker = start("worker", *flags, pre=pre)
    assert [_outcome(_batch(worker)) for _ in range(4)] == ["OK"] * 4
    # The fault hook lives in the completion-queue pump: through grpc.aio it never runs.
    assert _outcome(_batch(worker, fault="raise")) == "OK"
    lines = worker.log_lines("through grpc.aio")
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert record["level"] == level and why in record["msg"], record
    assert "/halcyon.v1.WorkerService/ExecuteBatch" in record["msg"]
    text = worker.metrics()
    assert 'halcyon_serving_path_info{path="aio"} 1.0' in text
    assert re.search(r'grpc_server_handled_total\{[^}]*grpc_method="ExecuteBatch"[^}]*\} 5', text)


def _infer(server: Server, fault: str | None = None) -> Future[Any]:
    stub = infer_pb2_grpc.InferServiceStub(server.channel)
    metadata = [("x-api-key", "demo-key-premium")]
    if fault is not None:
        metadata.append((FAULT_KEY, fault))
    request = infer_pb2.InferRequest(model="llama-3-8b", input="hello")
    future: Future[Any] = stub.Infer.future(request, metadata=metadata, timeout=5)
    return future


def test_sigterm_on_the_fast_path_exits_0_without_a_core_abort(start: Start) -> None:
    worker = start("worker", "--serving-path", "fast", "--intercept-ms", "300")
    gateway = start("gateway", "--serving-path", "fast")
    assert _outcome(_batch(worker, fault="raise")) == "INTERNAL"
    assert _outcome(_infer(gateway, fault="raise")) == "INTERNAL"
    assert _outcome(_infer(gateway)) == "UNAVAILABLE"  # no fleet: NO_CAPACITY, typed
    in_flight = [_batch(worker) for _ in range(8)]
    time.sleep(0.1)
    stop = threading.Event()
    late: list[Future[Any]] = []

    def keep_sending() -> None:  # calls that arrive while both servers stop
        while not stop.is_set():
            late.extend((_batch(worker, timeout=5), _infer(gateway)))
            time.sleep(0.01)

    sender = threading.Thread(target=keep_sending)
    sender.start()
    for server in (worker, gateway):
        server.popen.send_signal(signal.SIGTERM)
    codes = (worker.wait_exit(15), gateway.wait_exit(15))
    stop.set()
    sender.join()
    assert codes == (0, 0), worker.log()[-2000:] + gateway.log()[-2000:]
    assert [_outcome(f) for f in in_flight] == ["OK"] * 8  # accepted work finished
    assert "DEADLINE_EXCEEDED" not in {_outcome(f) for f in late}
    for server in (worker, gateway):
        assert not CORE_ABORT.search(server.log()), server.log()
