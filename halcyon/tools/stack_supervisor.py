"""The stack's child-process supervisor: start children in order, restart the ones that die.

What it decides: the life of the stack's processes, as an orchestrator would run them.

* **Supervised.** A child that dies is reported and restarted with backoff, on the same ports
  and state directory, so ``kill -9`` of a worker or of the controller is a demonstration of
  what Halcyon survives, not the end of the stack. The stack stops only when asked.
* **Nothing left behind.** Each child is started by :mod:`halcyon.tools.launcher`: in its own
  process group (so a Ctrl-C at the terminal reaches only the stack, which stops the children
  in order: gateway, workers, controller) and told to die with the stack
  (:mod:`common.parent_death`), so even a SIGKILL of the stack takes every child with it. A
  second signal hastens the stop (every child at once, SIGKILL after a few seconds); a third
  kills at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from halcyon.tools import launcher
from halcyon.tools.stack_layout import (
    BASE_FLEET,
    CANARY,
    MODEL,
    ONNX_CANARY,
    ONNX_FLEET,
    ONNX_PRESET,
    ONNX_SEEDS,
    ReplicaSpec,
    gateway_name,
    nth_address,
)

# The children's SIGTERM behaviour: a short drain delay (nothing balances across them) and a
# grace well inside the stack's own wait for each of them.
CHILD_DRAIN_DELAY_S = 0.2
CHILD_SHUTDOWN_GRACE_S = 5.0
STOP_TIMEOUT_S = 10.0  # per group of children on an orderly stop, then they are hurried
HURRY_TIMEOUT_S = 3.0  # after a second signal, SIGKILL whatever still runs this much later
READY_TIMEOUT_S = 30.0
RESTART_BACKOFF_S = (0.5, 15.0)  # first delay, ceiling (doubling per consecutive failure)
STABLE_AFTER_S = 30.0  # a child up this long has its backoff reset
POLL_S = 0.1


class StackError(RuntimeError):
    """The stack cannot start; the message says why and what to do."""


class _StopRequested(Exception):
    """A signal arrived while the stack was still starting."""


def _flags(**values: object) -> list[str]:
    """``_flags(metrics_listen="x")`` -> ``["--metrics-listen", "x"]``."""
    out: list[str] = []
    for key, value in values.items():
        out += ["--" + key.replace("_", "-"), str(value)]
    return out


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class Child:
    """One supervised process: how to start it, and what it is doing now."""

    name: str
    argv: Callable[[], list[str]]  # the ``halcyon`` arguments, built at every (re)start
    ready_file: Path
    log_path: Path | None  # None: logs go to the stack's terminal (--verbose)
    proc: subprocess.Popen[bytes] | None = None
    ready: dict[str, Any] | None = None
    waiting_ready: bool = False
    started_at: float = 0.0
    failures: int = 0  # consecutive exits, for the restart backoff
    restarts: int = 0
    restart_at: float | None = None
    signalled: bool = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class _Signals:
    """Signals received; the handler only counts, the stack acts between steps."""

    count: int = 0
    last: str = ""
    at: list[float] = field(default_factory=list)

    def handler(self, signum: int, _frame: object) -> None:
        self.count += 1
        self.last = signal.Signals(signum).name
        self.at.append(time.monotonic())


class Stack:
    """Starts children in dependency order, restarts the ones that die, stops them in reverse."""

    def __init__(
        self,
        args: argparse.Namespace,
        state_dir: Path,
        env: dict[str, str],
        fleet: list[ReplicaSpec] | None = None,
    ) -> None:
        """``fleet`` replaces the default fleet of ``args.runtime`` (the sweep's own)."""
        self.args = args
        self._fleet = fleet
        self.state_dir = state_dir
        self.env = env
        self.signals = _Signals()
        self.controller: Child | None = None
        self.workers: list[Child] = []
        self.gateways: list[Child] = []  # --gateways N, on consecutive ports

    @property
    def gateway(self) -> Child | None:
        """The first gateway (the one on --gateway-listen's port)."""
        return self.gateways[0] if self.gateways else None

    @property
    def children(self) -> list[Child]:
        head = [self.controller] if self.controller else []
        return head + self.workers + self.gateways

    # -- one child --------------------------------------------------------------------------

    def _child(self, name: str, argv: Callable[[], list[str]]) -> Child:
        log_path = None if self.args.verbose else self.state_dir / f"{name}.log"
        return Child(name, argv, self.state_dir / f"{name}.ready.json", log_path)

    def _spawn(self, child: Child) -> None:
        child.proc = launcher.launch(
            child.argv(), ready_file=child.ready_file, log_path=child.log_path, env=self.env
        )
        child.started_at = time.monotonic()
        child.waiting_ready = True
        child.signalled = False
        child.restart_at = None

    def _check_ready(self, child: Child) -> bool:
        """Whether ``child`` wrote its ready file (recorded); raises nothing."""
        info = launcher.read_ready(child.ready_file)
        if info is None:
            return False
        child.ready = info
        child.waiting_ready = False
        return True

    def _wait_ready(self, child: Child) -> dict[str, Any]:
        def stop_requested() -> None:
            if self.signals.count:
                raise _StopRequested

        assert child.proc is not None
        try:
            info = launcher.wait_ready(
                child.proc, child.ready_file, READY_TIMEOUT_S, poll_s=0.05, between=stop_requested
            )
        except launcher.NotReady as exc:
            if exc.returncode is None:
                raise StackError(
                    f"{child.name} was not ready within {READY_TIMEOUT_S:.0f} s"
                    + self._log_hint(child)
                ) from None
            raise StackError(
                f"{child.name} {_exit_text(exc.returncode)} before it was ready"
                + self._log_hint(child)
            ) from None
        child.ready = info
        child.waiting_ready = False
        return info

    def _log_hint(self, child: Child) -> str:
        if child.log_path is None:
            return ""
        try:
            lines = child.log_path.read_text(errors="replace").strip().splitlines()[-5:]
        except OSError:
            return ""
        return f"; last log lines ({child.log_path}):\n    " + "\n    ".join(lines)

    def _last_message(self, child: Child) -> str:
        """The last log record's message (JSON logs), for one-line reports."""
        if child.log_path is None:
            return ""
        try:
            lines = child.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        for line in reversed(lines[-20:]):
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("level") in ("ERROR", "WARNING"):
                    return f": {record.get('msg')}" + (
                        f" ({record['error']})" if record.get("error") else ""
                    )
        return ""

    # -- starting ---------------------------------------------------------------------------

    def _serving_flags(self, child_name: str, listen: str, metrics: str) -> list[str]:
        """Listen flags: the first start's, or the addresses bound then (restarts keep them)."""
        child = next((c for c in self.children if c.name == child_name), None)
        if child is not None and child.ready is not None:
            listen = child.ready.get("grpc") or listen
            metrics = child.ready.get("metrics") or metrics
        return [
            *_flags(listen=listen, metrics_listen=metrics),
            *_flags(drain_delay=CHILD_DRAIN_DELAY_S, shutdown_grace=CHILD_SHUTDOWN_GRACE_S),
        ]

    def _console_flags(self) -> list[str]:
        """``--console-listen``: the flag's at first (none: the controller's default, which it
        skips with a warning when taken), the address bound then on restarts."""
        bound = (self.controller.ready or {}).get("console") if self.controller else None
        listen = bound or self.args.console_listen
        return ["--console-listen", str(listen)] if listen else []

    def start(self) -> None:
        a = self.args
        state = self.state_dir

        def controller_argv() -> list[str]:
            return [
                "controller",
                *self._serving_flags("controller", a.controller_listen, "127.0.0.1:0"),
                *self._console_flags(),
                "--db", str(state / "controller.sqlite"),
                "--stable", f"{MODEL}=v1",
            ]  # fmt: skip

        self.controller = self._child("controller", controller_argv)
        self._spawn(self.controller)
        controller = self._wait_ready(self.controller)["grpc"]

        onnx = a.runtime == "onnx"
        if self._fleet is not None:
            fleet = list(self._fleet)
        elif onnx:
            fleet = list(ONNX_FLEET) + ([ONNX_CANARY] if a.canary else [])
        else:
            fleet = list(BASE_FLEET) + ([CANARY] if a.canary else [])
        models = self._onnx_models(fleet) if onnx else {}
        if a.zero_device_time:
            a.intercept_ms, a.ms_per_token = 0.0, 0.0
        device: list[str] = []
        if a.intercept_ms is not None:
            device += ["--intercept-ms", str(a.intercept_ms)]
        if a.ms_per_token is not None:
            device += ["--ms-per-token", str(a.ms_per_token)]

        def runtime_flags(spec: ReplicaSpec) -> list[str]:
            if not onnx:
                return device
            return _flags(runtime="onnx", model_file=models[spec.version], threads=spec.threads)

        def worker_argv(i: int, spec: ReplicaSpec) -> Callable[[], list[str]]:
            def argv() -> list[str]:
                return [
                    "worker",
                    *self._serving_flags(spec.replica_id, "127.0.0.1:0", "127.0.0.1:0"),
                    *_flags(
                        replica_id=spec.replica_id,
                        model=MODEL,
                        version=spec.version,
                        hardware=spec.hardware,
                        speed=spec.speed,
                        seed=1000 + i,
                        controller=controller,
                        reconnect_max_s=2,
                    ),
                    *runtime_flags(spec),
                ]

            return argv

        self.workers = [
            self._child(spec.replica_id, worker_argv(i, spec)) for i, spec in enumerate(fleet)
        ]
        for worker in self.workers:
            self._spawn(worker)
        for worker in self.workers:
            self._wait_ready(worker)

        count = getattr(a, "gateways", 1)

        def gateway_argv(index: int) -> Callable[[], list[str]]:
            name = gateway_name(index)
            listen = nth_address(a.gateway_listen, index)
            metrics = nth_address(a.gateway_metrics_listen, index)
            # Several gateways share each tenant's quota (ADR 0003); one keeps today's flags.
            shared = ["--gateway-id", name, "--expected-gateways", str(count)] if count > 1 else []
            return lambda: [
                "gateway",
                *self._serving_flags(name, listen, metrics),
                "--controller", controller,
                "--batching", a.batching,
                *shared,
            ]  # fmt: skip

        self.gateways = [self._child(gateway_name(i), gateway_argv(i)) for i in range(count)]
        for gateway in self.gateways:
            self._spawn(gateway)
        for gateway in self.gateways:
            self._wait_ready(gateway)

    def _onnx_models(self, fleet: list[ReplicaSpec]) -> dict[str, str]:
        """The generated decoder of each version in the fleet, made on first use (cached)."""
        try:
            from worker.onnx_model import ensure_model
        except ImportError as exc:  # onnx / onnxruntime not installed
            raise StackError(
                f"--runtime onnx needs the onnx and onnxruntime packages ({exc}); "
                "install them with: pip install 'halcyon[onnx]'"
            ) from exc
        models: dict[str, str] = {}
        for version in sorted({spec.version for spec in fleet}):
            seed = ONNX_SEEDS.get(version, 0)
            _say(f"model for {version}: the generated {ONNX_PRESET} decoder, seed {seed} …")
            models[version] = str(ensure_model(ONNX_PRESET, seed=seed))
            _say(f"  {models[version]}")
        return models

    # -- supervising ------------------------------------------------------------------------

    def supervise(self) -> None:
        """Restart children that die, with backoff, until a signal asks the stack to stop."""
        while not self.signals.count:
            now = time.monotonic()
            for child in self.children:
                self._supervise_one(child, now)
            time.sleep(POLL_S)

    def _supervise_one(self, child: Child, now: float) -> None:
        proc = child.proc
        if proc is not None and proc.poll() is None:
            if child.waiting_ready and self._check_ready(child):
                _say(f"{child.name} is back (pid {proc.pid}, restart {child.restarts})")
            elif child.failures and now - child.started_at >= STABLE_AFTER_S:
                child.failures = 0
            return
        if child.restart_at is None:
            assert proc is not None
            first, ceiling = RESTART_BACKOFF_S
            delay = min(ceiling, first * 2**child.failures)
            child.failures += 1
            child.restart_at = now + delay
            _say(
                f"{child.name} (pid {proc.pid}) {_exit_text(proc.returncode)}"
                f"{self._last_message(child)}; restarting it in {delay:.1f} s on the same "
                "ports" + (f" (log: {child.log_path})" if child.log_path else "")
            )
            return
        if now >= child.restart_at:
            child.restarts += 1
            self._spawn(child)

    # -- stopping ---------------------------------------------------------------------------

    def _terminate(self, children: list[Child]) -> None:
        for child in children:
            if child.running and not child.signalled:
                assert child.proc is not None
                child.signalled = True
                launcher.terminate(child.proc)

    def _kill(self, children: list[Child]) -> None:
        for child in children:
            if child.proc is not None:
                launcher.kill(child.proc)

    def _wait(self, children: list[Child], timeout_s: float, signals_seen: int) -> bool:
        """True when every child exited; False on timeout or when another signal came."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not any(c.running for c in children):
                return True
            if self.signals.count > signals_seen:
                return False
            time.sleep(0.02)
        return not any(c.running for c in children)

    def stop(self) -> None:
        """Gateway first (nothing it accepted is lost), then workers, then the controller; a
        second signal stops the rest at once, a third (or a hang) kills them."""
        try:
            groups = [self.gateways, self.workers]
            groups.append([self.controller] if self.controller else [])
            seen = self.signals.count  # a signal beyond these hurries the stop
            for group in groups:
                self._terminate(group)
                if not self._wait(group, STOP_TIMEOUT_S, seen):
                    break
            remaining = [c for c in self.children if c.running]
            if remaining:
                hurried = self.signals.count > seen
                if hurried:
                    _say("stopping every process now (another Ctrl-C kills them)")
                self._terminate(remaining)
                if not self._wait(remaining, HURRY_TIMEOUT_S, max(seen, self.signals.count)):
                    self._kill(remaining)
        finally:
            self._kill(self.children)
            for child in self.children:
                if child.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.proc.wait(timeout=5)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
