"""The end-to-end launcher and fleet: real ``halcyon`` processes on 127.0.0.1, port 0.

What it decides: how every test suite starts, watches and stops real processes. Each is started
by :mod:`halcyon.tools.launcher` (the one launcher the stack and ``rollout verify`` use too) as
``python -m halcyon <command> --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --ready-file
<tmp>/<name>.json`` with its stdout and stderr in ``<tmp>/<name>.log``: in its own process group
and dying with the test run even if pytest is killed. A failure to start (or a process dying
while a test waits on it) is reported with the tail of that log. :meth:`Launcher.close` stops
every process: SIGTERM, then SIGKILL if it outlives its grace.

* :class:`Proc` — one process; :class:`Launcher` — starts them (and whole fleets) and stops
  them all; :class:`Fleet` — a controller, its workers and a gateway, with clients for them.
* :func:`wait_for` — :func:`tests.support.waiting.wait_until` that also fails at once, with the
  log, when a watched process dies; metrics scraping, rich errors, grpcurl.
* :func:`pytest_runtest_makereport` — the hook a suite's conftest binds so that a failing test's
  report carries what its processes logged.

Waiting is always on a condition with a timeout (a ready file, GetState, a health check, a
metric), never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from common.errors import RichError, parse_rpc_error
from halcyon.tools import launcher
from halcyon.v1 import control_pb2, control_pb2_grpc, infer_pb2, infer_pb2_grpc
from tests.support.waiting import wait_until

MODEL = "llama-3-8b"
FLEET_TOKEN = "e2e-fleet-token"
OPERATOR_TOKEN = "e2e-operator-token"
API_KEY = "demo-key-premium"
START_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 25
GRPCURL = str(Path(sys.executable).parent / "grpcurl")
# Zero device time: requests cost only the gateway's scheduling and the loopback hops.
INSTANT = ("--intercept-ms", "0", "--ms-per-token", "0", "--jitter", "0")

T = TypeVar("T")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
    env["HALCYON_FLEET_TOKEN"] = FLEET_TOKEN
    env["HALCYON_OPERATOR_TOKEN"] = OPERATOR_TOKEN
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(eq=False)
class Proc:
    """One ``halcyon`` subprocess: start it, wait for its ready file, signal it, stop it."""

    name: str
    args: list[str]
    workdir: Path
    popen: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    listen: str = "127.0.0.1:0"  # a fixed address to restart a process where it was
    # A controller's operator console on a free port; False leaves its default address.
    free_console: bool = True

    @property
    def ready_file(self) -> Path:
        return self.workdir / f"{self.name}.json"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self) -> Proc:
        argv = [
            self.args[0],
            # Nothing balances across test processes: stop accepting at once on SIGTERM. A test
            # of the drain delay passes its own, later on the line, which wins.
            "--drain-delay",
            "0",
            # A controller's operator console on a free port (a test's own flag, later, wins).
            *(
                ["--console-listen", "127.0.0.1:0"]
                if self.args[0] == "controller" and self.free_console
                else []
            ),
            *self.args[1:],
            "--listen",
            self.listen,
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        self.popen = launcher.launch(
            argv, ready_file=self.ready_file, log_path=self.log_file, env=_env(), cwd=self.workdir
        )
        return self

    # -- state ------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    @property
    def grpc(self) -> str:
        return str(self.info["grpc"])

    @property
    def metrics(self) -> str:
        return str(self.info["metrics"])

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def errors(self, limit: int = 3) -> list[str]:
        """The first ERROR-level log records, tracebacks unfolded."""
        found = []
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return []
        for line in lines:
            if '"level": "ERROR"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                found.append(line)
            else:
                found.append(f"{record.get('msg')}\n{record.get('exc', '')}".rstrip())
            if len(found) >= limit:
                break
        return found

    def describe(self) -> str:
        state = "running" if self.alive else f"exited with {self.returncode}"
        text = f"{self.name} ({state}); last lines of {self.log_file}:\n{self.log_tail()}"
        errors = self.errors()
        if errors:
            text += "\nfirst errors logged:\n" + "\n".join(errors)
        return text

    def check_alive(self) -> None:
        if not self.alive:
            raise AssertionError(f"process {self.describe()}")

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        """Wait for the ready file; fail at once (with the log) if the process dies first."""
        assert self.popen is not None
        try:
            self.info = launcher.wait_ready(self.popen, self.ready_file, timeout_s)
        except launcher.NotReady as exc:
            if exc.returncode is not None:
                raise AssertionError(f"process {self.describe()}") from None
            raise AssertionError(
                f"no ready file from {self.name} within {timeout_s} s: {self.describe()}"
            ) from None
        assert self.info["pid"] == self.pid, self.info
        return self.info

    # -- stopping ---------------------------------------------------------------------------

    def send(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.popen is not None
            self.popen.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code; fails the test if the process is still running after timeout_s."""
        assert self.popen is not None
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running {timeout_s} s later: {self.describe()}"
            ) from None

    def kill(self) -> int:
        """SIGKILL (the process and its group) and reap."""
        assert self.popen is not None
        launcher.kill(self.popen)
        return self.popen.wait(timeout=launcher.KILL_REAP_TIMEOUT_S)

    def terminate(self) -> None:
        """SIGTERM (plus SIGCONT, in case a test stopped it) without waiting."""
        if self.popen is not None:
            launcher.terminate(self.popen)

    def reap(self, timeout_s: float = 8.0) -> int | None:
        """Wait for the exit; SIGKILL if it outlives ``timeout_s``."""
        if self.popen is None:
            return None
        return launcher.reap(self.popen, timeout_s)

    def stop(self, timeout_s: float = 8.0) -> int | None:
        """SIGTERM, then SIGKILL if it lingers."""
        self.terminate()
        return self.reap(timeout_s)


# -- polling, metrics, errors ---------------------------------------------------------------


def wait_for(
    probe: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    watch: tuple[Proc, ...] = (),
    interval_s: float = 0.02,
) -> T:
    """:func:`~tests.support.waiting.wait_until` for processes and their RPCs.

    Processes in ``watch`` must stay alive meanwhile: if one dies the failure says so at once,
    with its log. ``probe`` may raise ``grpc.RpcError`` / ``OSError`` while things come up;
    those count as "not yet" and the last one is reported on timeout.
    """

    def all_alive() -> None:
        for proc in watch:
            proc.check_alive()

    return wait_until(
        probe,
        timeout_s,
        what,
        interval_s=interval_s,
        transient=(grpc.RpcError, OSError),
        check=all_alive,
        details=lambda: "\n".join(p.describe() for p in watch),
    )


Families = dict[str, Any]


def scrape(proc: Proc) -> Families:
    """The process's /metrics, parsed: family name -> Metric (samples with labels)."""
    with urllib.request.urlopen(f"http://{proc.metrics}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: Families, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for family in families.values():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def rich_error(call: Callable[[], Any]) -> RichError:
    """Run a call that must fail; the rich error it carried."""
    try:
        result = call()
    except grpc.RpcError as err:
        return parse_rpc_error(err)
    raise AssertionError(f"expected an RPC error, got {result!r}")


def duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def grpcurl(*args: str, timeout_s: float = 20.0) -> subprocess.CompletedProcess[str]:
    """Run the real grpcurl binary (plaintext); stdout and stderr captured separately."""
    return subprocess.run(
        [GRPCURL, "-plaintext", "-max-time", "10", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


# -- a running fleet ------------------------------------------------------------------------


class Fleet:
    """A controller, its workers and a gateway, with clients for them."""

    def __init__(self, controller: Proc, workers: dict[str, Proc], gateway: Proc) -> None:
        self.controller = controller
        self.workers = workers
        self.gateway = gateway
        self._channels: dict[str, grpc.Channel] = {}

    @property
    def procs(self) -> tuple[Proc, ...]:
        return (self.controller, *self.workers.values(), self.gateway)

    def live(self) -> tuple[Proc, ...]:
        return tuple(p for p in self.procs if p.alive)

    def channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return self._channels[address]

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    # -- the gateway ------------------------------------------------------------------------

    @property
    def infer_stub(self) -> infer_pb2_grpc.InferServiceStub:
        return infer_pb2_grpc.InferServiceStub(self.channel(self.gateway.grpc))

    def infer(
        self,
        *,
        key: str | None = API_KEY,
        deadline_s: float | None = 5.0,
        **fields: Any,
    ) -> infer_pb2.InferResponse:
        fields.setdefault("model", MODEL)
        fields.setdefault("input", "hello from the e2e tests")
        metadata = (("x-api-key", key),) if key is not None else ()
        return self.infer_stub.Infer(
            infer_pb2.InferRequest(**fields), metadata=metadata, timeout=deadline_s
        )

    def health(self, proc: Proc, service: str = "readiness") -> int:
        stub = health_pb2_grpc.HealthStub(self.channel(proc.grpc))
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        return int(reply.status)

    def gateway_replicas(self) -> int:
        return int(sample(scrape(self.gateway), "halcyon_gateway_fleet_replicas"))

    # -- the controller ---------------------------------------------------------------------

    @property
    def control_stub(self) -> control_pb2_grpc.ControlServiceStub:
        return control_pb2_grpc.ControlServiceStub(self.channel(self.controller.grpc))

    def get_state(self, token: str = OPERATOR_TOKEN) -> control_pb2.GetStateResponse:
        return self.control_stub.GetState(
            control_pb2.GetStateRequest(),
            metadata=(("authorization", f"Bearer {token}"),),
            timeout=5,
        )

    def replica_ids(self) -> set[str]:
        return {m.replica.replica_id for m in self.get_state().replicas}

    # -- waiting ----------------------------------------------------------------------------

    def wait_converged(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every worker registered, and the gateway ready with all of them in its view."""
        want = set(self.workers)
        watch = self.live()
        wait_for(
            lambda: self.replica_ids() == want, timeout_s, f"the controller to list {want}",
            watch=watch,
        )  # fmt: skip
        wait_for(
            lambda: self.health(self.gateway) == health_pb2.HealthCheckResponse.SERVING,
            timeout_s,
            "gateway readiness SERVING",
            watch=watch,
        )
        wait_for(
            lambda: self.gateway_replicas() == len(want),
            timeout_s,
            f"the gateway to see {len(want)} replicas",
            watch=watch,
        )


class Launcher:
    """Starts processes in a directory and stops every one of them at :meth:`close`."""

    def __init__(self, workdir: Path, *, free_console: bool = True) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []
        self.fleets: list[Fleet] = []
        self.free_console = free_console  # Proc.free_console for every process started

    def spawn(self, name: str, *args: str) -> Proc:
        proc = Proc(name, list(args), self.workdir, free_console=self.free_console)
        self.procs.append(proc)
        return proc.start()

    def restart(self, proc: Proc) -> Proc:
        """Start ``proc`` again, same arguments, on the same gRPC address (it must have
        exited); the new process replaces it in every fleet. Its log is appended to."""
        assert not proc.alive, f"{proc.name} is still running"
        again = Proc(
            proc.name, list(proc.args), self.workdir, listen=proc.grpc,
            free_console=proc.free_console,
        )  # fmt: skip
        again.log_file.rename(self.workdir / f"{proc.name}.{proc.pid}.log")
        self.procs.append(again)
        for fleet in self.fleets:
            if fleet.controller is proc:
                fleet.controller = again
            for rid, worker in fleet.workers.items():
                if worker is proc:
                    fleet.workers[rid] = again
            if fleet.gateway is proc:
                fleet.gateway = again
        again.start()
        again.wait_ready()
        return again

    def controller(self, *extra: str, name: str = "controller") -> Proc:
        proc = self.spawn(
            name,
            "controller",
            "--db",
            str(self.workdir / f"{name}.sqlite"),
            "--stable",
            f"{MODEL}=v1",
            "--lease-ttl",
            "3",
            "--heartbeat-interval",
            "1",
            "--shutdown-grace",
            "2",
            *extra,
        )
        proc.wait_ready()
        return proc

    def worker(self, controller: Proc, replica_id: str, *extra: str) -> Proc:
        return self.spawn(
            replica_id,
            "worker",
            "--controller",
            controller.grpc,
            "--replica-id",
            replica_id,
            "--model",
            MODEL,
            "--version",
            "v1",
            "--speed",
            "1.0",
            "--reconnect-max-s",
            "1",
            "--shutdown-grace",
            "2",
            *extra,
        )

    def gateway(self, controller: Proc, *extra: str, name: str = "gateway") -> Proc:
        return self.spawn(
            name,
            "gateway",
            "--controller",
            controller.grpc,
            "--gateway-id",
            name,
            "--shutdown-grace",
            "2",
            # The demo tenants (demo-key-*) on loopback; the credentials come from the env.
            "--dev-mode",
            *extra,
        )

    def fleet(
        self,
        workers: dict[str, tuple[str, ...]] | None = None,
        *,
        controller_args: tuple[str, ...] = (),
        gateway_args: tuple[str, ...] = (),
        converge_timeout_s: float = START_TIMEOUT_S,
    ) -> Fleet:
        """A controller, then workers (replica id -> extra flags) and a gateway in parallel;
        returns once the gateway is ready and sees every worker (a worker registers after its
        warm-up: two of its batches — pass a longer ``converge_timeout_s`` for slow devices)."""
        if workers is None:
            workers = {"replica-a": INSTANT, "replica-b": INSTANT}
        controller = self.controller(*controller_args)
        started = {rid: self.worker(controller, rid, *extra) for rid, extra in workers.items()}
        gateway = self.gateway(controller, *gateway_args)
        for proc in (*started.values(), gateway):
            proc.wait_ready()
        fleet = Fleet(controller, started, gateway)
        self.fleets.append(fleet)
        fleet.wait_converged(converge_timeout_s)
        return fleet

    def attach(self, fleet: Fleet, gateway: Proc) -> Fleet:
        """The same controller and workers seen through another (started) gateway."""
        other = Fleet(fleet.controller, fleet.workers, gateway)
        self.fleets.append(other)
        other.wait_converged()
        return other

    def close(self) -> None:
        for fleet in self.fleets:
            fleet.close()
        # SIGTERM everything at once (gateways first), then reap: teardown in parallel.
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            proc.reap()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """When an e2e test fails, attach what its processes logged to the report."""
    report = yield
    if report.when == "call" and report.failed:
        procs: list[Proc] = []
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, (Launcher, Fleet)):
                procs += value.procs
        if procs:
            report.sections.append(
                ("halcyon processes", "\n\n".join(p.describe() for p in dict.fromkeys(procs)))
            )
    return report
