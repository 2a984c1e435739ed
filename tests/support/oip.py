"""Helpers for the Open Inference Protocol tests: a real KServe model server as the backend.

The backend is ``scripts/kserve_decoder.py`` (KServe's model server around the generated ONNX
decoder) run by ``.tools/kserve/bin/python`` — its own virtualenv, made by ``make
tools-kserve`` (``make test`` makes it). Without it these tests skip with one line saying so,
except under CI (``CI`` set), where a missing backend is a failure: CI must run them.

* :class:`Backend` — one ``scripts/kserve_decoder.py`` process on 127.0.0.1 (a free gRPC
  port it keeps across restarts), ready when ServerReady and ModelReady say so;
  :class:`Backends` starts them and kills them all at teardown.

The halcyon processes in front of a backend come from :mod:`tests.support.e2e`, so they start,
are watched and stop the same way as in the e2e suite.

Waiting is always on a condition (the backend's ServerReady, a ready file, GetState).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from halcyon.oip import grpc_predict_v2_pb2 as pb
from halcyon.oip import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
KSERVE_PYTHON = REPO / ".tools" / "kserve" / "bin" / "python"
SCRIPT = REPO / "scripts" / "kserve_decoder.py"
BACKEND_MODEL = "decoder"
BACKEND_START_S = 30.0  # kserve imports take ~5 s on an idle machine; 2 shared cores


def require_kserve() -> Path:
    """The KServe virtualenv's python; skips (a developer's machine) or fails (CI) without."""
    if KSERVE_PYTHON.exists():
        return KSERVE_PYTHON
    message = ".tools/kserve missing: run make tools-kserve"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (make test installs it; CI must run the OIP tests)")
    pytest.skip(message)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(eq=False)
class Backend:
    """One KServe model server process on 127.0.0.1 (a fixed gRPC port, kept on restart)."""

    name: str
    args: list[str]
    workdir: Path
    model_file: Path
    grpc_port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> Backend:
        assert not self.alive, f"{self.name} is already running"
        argv = [
            str(KSERVE_PYTHON),
            str(SCRIPT),
            "--model-file", str(self.model_file),
            "--model-name", BACKEND_MODEL,
            "--grpc-port", str(self.grpc_port),
            *self.args,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_file, "ab") as log:
            self.popen = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1
        return self

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def describe(self) -> str:
        state = "running" if self.alive else f"exited with {self.popen and self.popen.poll()}"
        tail = "\n".join(self.log_text().splitlines()[-25:])
        return f"backend {self.name} ({state}) on {self.address}; last lines:\n{tail}"

    def ready(self, timeout_s: float = 1.0) -> bool:
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                server = stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout_s)
                model = stub.ModelReady(pb.ModelReadyRequest(name=BACKEND_MODEL), timeout=timeout_s)
            except grpc.RpcError:
                return False
        return bool(server.ready and model.ready)

    def wait_ready(self, timeout_s: float = BACKEND_START_S) -> Backend:
        def running() -> None:
            if not self.alive:
                raise AssertionError(f"the backend died at start: {self.describe()}")

        wait_until(
            self.ready, timeout_s, f"backend {self.name} to be ready", interval_s=0.1,
            check=running, details=self.describe,
        )  # fmt: skip
        return self

    def kill(self) -> None:
        """SIGKILL (a crash: no goodbye on its connections) and reap."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


class Backends:
    """Starts KServe backends and kills every one of them at :meth:`close`."""

    def __init__(self, workdir: Path, model_file: Path) -> None:
        self.workdir = workdir
        self.model_file = model_file
        self.started: list[Backend] = []

    def start(self, *args: str, name: str = "backend", wait: bool = True) -> Backend:
        require_kserve()
        backend = Backend(f"{name}-{len(self.started)}", list(args), self.workdir, self.model_file)
        self.started.append(backend)
        backend.start()
        return backend.wait_ready() if wait else backend

    def close(self) -> None:
        for backend in self.started:
            backend.stop()
