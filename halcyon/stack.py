"""``halcyon stack``: the whole system on loopback, one process per component, supervised.

Starts a controller, a deliberately heterogeneous fleet (a fast v1 replica, a 0.6x straggler
v1 replica, and with ``--canary`` a v2 replica on faster hardware) and a gateway, each as its
own ``halcyon`` process. Identical replicas make any load balancer look good; this fleet does
not.

What it decides: the life of those processes, as an orchestrator would run them.

* **Supervised.** A child that dies is reported and restarted with backoff, on the same ports
  and state directory, so ``kill -9`` of a worker or of the controller is a demonstration of
  what Halcyon survives, not the end of the stack. The stack stops only when asked.
* **Nothing left behind.** Each child runs in its own process group (so a Ctrl-C at the
  terminal reaches only the stack, which stops the children in order: gateway, workers,
  controller) and carries a parent-death signal (``PR_SET_PDEATHSIG``: SIGKILL), so even a
  SIGKILL of the stack takes every child with it. A second signal hastens the stop (every
  child at once, SIGKILL after a few seconds); a third kills at once. The temporary state
  directory is removed at exit unless ``--state-dir`` was given, and those of stacks that
  died without cleaning up are removed by the next one.
* **No secret in sight.** Credentials come from ``--fleet-token-file`` /
  ``--operator-token-file`` or ``$HALCYON_FLEET_TOKEN`` / ``$HALCYON_OPERATOR_TOKEN``, else the
  public development tokens (the stack runs its children in development mode, loopback only);
  children get them through their environment, never their command line. The operator token
  is written to ``<state-dir>/operator-token`` (mode 0600) and the printout says how to read
  it, never the token itself.
* **Commands that work when pasted** into a fresh shell: absolute paths to ``halcyon`` and
  ``grpcurl`` next to the running interpreter.
* **A port already taken** is reported with the process holding it, before anything starts.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from common.argtypes import hostport, non_negative
from common.credentials import (
    DEV_FLEET_TOKEN,
    DEV_MODE_ENV,
    DEV_OPERATOR_TOKEN,
    FLEET_TOKEN_ENV,
    OPERATOR_TOKEN_ENV,
    CredentialError,
    add_credential_arguments,
    is_loopback,
    load_credentials,
)
from common.ports import describe_port_holders
from common.serving import parse_hostport

MODEL = "llama-3-8b"
STATE_PREFIX = "halcyon-stack-"
OPERATOR_TOKEN_FILE = "operator-token"
PID_FILE = "stack.pid"
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
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ReplicaSpec:
    replica_id: str
    version: str
    hardware: str
    speed: float
    threads: int = 1  # --runtime onnx: ONNX Runtime intra-op threads


BASE_FLEET = (
    ReplicaSpec("replica-a", "v1", "a10g", 1.0),
    ReplicaSpec("replica-b", "v1", "t4", 0.6),
)
CANARY = ReplicaSpec("replica-c", "v2", "h100", 1.6)
# --runtime onnx: the same generated decoder per version, on unequal CPU budgets (two
# intra-op threads against one), so the fleet is heterogeneous as the simulated one is. The
# canary runs other weights (another seed) of the same size: a new version of the model.
ONNX_FLEET = (
    ReplicaSpec("replica-a", "v1", "cpu-2t", 1.0, threads=2),
    ReplicaSpec("replica-b", "v1", "cpu-1t", 1.0, threads=1),
)
ONNX_CANARY = ReplicaSpec("replica-c", "v2", "cpu-1t", 1.0, threads=1)
ONNX_PRESET = "small"
ONNX_SEEDS = {"v1": 0, "v2": 1}


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


def _parent_death_signal(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGKILL when the stack dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def preexec() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the stack died between fork and prctl
            os._exit(1)

    return preexec


@dataclass
class Child:
    """One supervised process: how to start it, and what it is doing now."""

    name: str
    argv: Callable[[], list[str]]  # the ``halcyon`` arguments, built at every (re)start
    ready_file: Path
    log_path: Path | None  # None: logs go to the stack's terminal (--verbose)
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
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
        self.gateway: Child | None = None
        self._preexec = _parent_death_signal(os.getpid())

    @property
    def children(self) -> list[Child]:
        head = [self.controller] if self.controller else []
        tail = [self.gateway] if self.gateway else []
        return head + self.workers + tail

    # -- one child --------------------------------------------------------------------------

    def _child(self, name: str, argv: Callable[[], list[str]]) -> Child:
        log_path = None if self.args.verbose else self.state_dir / f"{name}.log"
        return Child(name, argv, self.state_dir / f"{name}.ready.json", log_path)

    def _spawn(self, child: Child) -> None:
        child.ready_file.unlink(missing_ok=True)
        out: int | IO[bytes] | None = None
        if child.log_path is not None:
            if child.log is None:
                child.log = open(child.log_path, "ab")  # noqa: SIM115 - closed in close()
            out = child.log
        argv = [*child.argv(), "--ready-file", str(child.ready_file)]
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "halcyon", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=self.env,
            # Own process group: a Ctrl-C at the terminal reaches the stack only, which stops
            # the children in order. The parent-death signal covers a stack that is killed.
            process_group=0,
            preexec_fn=self._preexec,
        )
        child.started_at = time.monotonic()
        child.waiting_ready = True
        child.signalled = False
        child.restart_at = None

    def _check_ready(self, child: Child) -> bool:
        """Whether ``child`` wrote its ready file (recorded); raises nothing."""
        if not child.ready_file.exists():
            return False
        try:
            info = json.loads(child.ready_file.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        child.ready = info
        child.waiting_ready = False
        return True

    def _wait_ready(self, child: Child) -> dict[str, Any]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.signals.count:
                raise _StopRequested
            assert child.proc is not None
            if child.proc.poll() is not None:
                raise StackError(
                    f"{child.name} {_exit_text(child.proc.returncode)} before it was ready"
                    + self._log_hint(child)
                )
            if self._check_ready(child):
                assert child.ready is not None
                return child.ready
            time.sleep(0.05)
        raise StackError(
            f"{child.name} was not ready within {READY_TIMEOUT_S:.0f} s" + self._log_hint(child)
        )

    def _log_hint(self, child: Child) -> str:
        if child.log_path is None:
            return ""
        if child.log is not None:
            child.log.flush()
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

        def gateway_argv() -> list[str]:
            return [
                "gateway",
                *self._serving_flags("gateway", a.gateway_listen, a.gateway_metrics_listen),
                "--controller", controller,
                "--batching", a.batching,
            ]  # fmt: skip

        self.gateway = self._child("gateway", gateway_argv)
        self._spawn(self.gateway)
        self._wait_ready(self.gateway)

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
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)

    def _kill(self, children: list[Child]) -> None:
        for child in children:
            if child.proc is not None and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()

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
            groups = [[self.gateway] if self.gateway else [], self.workers]
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
                if child.log is not None:
                    child.log.close()
                    child.log = None

    # -- what to tell the user ----------------------------------------------------------------

    def describe(self) -> str:
        by_name = {c.name: c.ready or {} for c in self.children}
        gateway = by_name["gateway"].get("grpc", self.args.gateway_listen)
        gateway_metrics = by_name["gateway"].get("metrics", self.args.gateway_metrics_listen)
        controller = by_name["controller"].get("grpc", self.args.controller_listen)
        console = by_name["controller"].get("console_url") or "(not started: see controller.log)"
        grpcurl, halcyon = _tool("grpcurl"), _tool("halcyon")
        token_file = shlex.quote(str(self.state_dir / OPERATOR_TOKEN_FILE))
        rows = [f"  {'process':<12} {'gRPC':<22} {'metrics':<22} pid"]
        for c in self.children:
            r = c.ready or {}
            pid = c.proc.pid if c.proc else "-"
            grpc_at, metrics_at = r.get("grpc", "?"), r.get("metrics", "-")
            rows.append(f"  {c.name:<12} {grpc_at:<22} {metrics_at:<22} {pid}")
        body = json.dumps(
            {"model": MODEL, "input": "hello", "max_output_tokens": 64, "timeout": "2s"}
        )
        victim = next((c for c in self.workers if c.name == "replica-b"), None)
        victim_pid = victim.proc.pid if victim and victim.proc else "PID"
        return "\n".join(
            [
                "Halcyon stack is up (Ctrl-C stops everything; a process that dies is restarted).",
                "",
                *rows,
                "",
                f"Operator console: {console}",
                f"  (read-only as it is; to promote, abort or drain, sign in with the operator "
                f"token from {token_file})",
                "",
                f"State and logs: {self.state_dir}"
                + ("" if self.args.state_dir else " (removed when the stack stops)"),
                "",
                "Send one request:",
                f"  {grpcurl} -plaintext -H 'x-api-key: demo-key-premium' \\",
                f"    -d '{body}' \\",
                f"    {gateway} halcyon.v1.InferService/Infer",
                "",
                "Drive real load:",
                f"  {halcyon} loadtest --target {gateway} --gateway-metrics {gateway_metrics} "
                "--clients 32 --seconds 20",
                "",
                f"Inspect the control plane (the operator token is in {token_file}, mode 0600):",
                f'  {grpcurl} -plaintext -H "authorization: Bearer $(cat {token_file})" \\',
                f"    {controller} halcyon.v1.ControlService/GetState",
                "",
                *(
                    [
                        "Ship v2 on evidence (with load running; `rollout --help` for more):",
                        f"  {halcyon} rollout start {MODEL} v2 --steps 20,50,100 --window 5 "
                        f"--watch --controller {controller} --operator-token-file {token_file}",
                        "",
                    ]
                    if self.args.canary
                    else []
                ),
                "Break something (the stack restarts it; the gateway routes around it):",
                f"  kill -9 {victim_pid}",
                "",
                f'Health: {grpcurl} -plaintext -d \'{{"service":"readiness"}}\' '
                f"{gateway} grpc.health.v1.Health/Check",
            ]
        )


def _tool(name: str) -> str:
    """An absolute, shell-quoted path to ``name`` next to this interpreter (the venv's bin)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return shlex.quote(str(beside))
    if name == "halcyon":
        return f"{shlex.quote(sys.executable)} -m halcyon"
    return shlex.quote(shutil.which(name) or name)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- state directory, ports, credentials ----------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (0600), replacing any file."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_state_dirs(tmp: Path | None = None) -> list[Path]:
    """Remove the temporary state directories of stacks that died without cleaning up (their
    ``stack.pid`` names a process that no longer exists); returns what was removed."""
    removed = []
    for d in (tmp or Path(tempfile.gettempdir())).glob(f"{STATE_PREFIX}*"):
        try:
            if not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
            pid = int((d / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if not _alive(pid):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _check_runtime(args: argparse.Namespace) -> None:
    if args.runtime != "simulated" and (
        args.zero_device_time or args.intercept_ms is not None or args.ms_per_token is not None
    ):
        raise StackError(
            "--zero-device-time, --intercept-ms and --ms-per-token describe the simulated "
            f"device; --runtime {args.runtime} measures its real cost instead"
        )


def _check_ports(args: argparse.Namespace) -> None:
    for flag, listen in (
        ("--controller-listen", args.controller_listen),
        ("--gateway-listen", args.gateway_listen),
        ("--gateway-metrics-listen", args.gateway_metrics_listen),
        *([("--console-listen", args.console_listen)] if args.console_listen else []),
    ):
        host, port = parse_hostport(listen)
        if not is_loopback(host):
            raise StackError(
                f"{flag} {listen}: the stack runs in development mode with public credentials, "
                "so it listens on loopback only; use 127.0.0.1:PORT"
            )
        holders = describe_port_holders(port) if port else ""
        if holders:
            raise StackError(
                f"port {port} ({flag}) is already in use, {holders}; stop that process or "
                f"pass {flag} 127.0.0.1:PORT (0 picks a free port)"
            )


def _child_env(args: argparse.Namespace) -> dict[str, str]:
    """The children's environment: this one, plus the credentials and development mode."""
    args.dev_mode = True  # public dev tokens when none are configured; loopback is checked
    quiet = logging.getLogger("halcyon.credentials")
    level, quiet.level = quiet.level, logging.ERROR  # one note below instead of a log line each
    try:
        credentials = load_credentials(
            args, fleet_required=True, operator_required=True, listen=args.gateway_listen
        )
    finally:
        quiet.setLevel(level)
    assert credentials.fleet is not None and credentials.operator is not None
    public = [
        name
        for name, token in (("fleet", credentials.fleet), ("operator", credentials.operator))
        if token in (DEV_FLEET_TOKEN, DEV_OPERATOR_TOKEN)
    ]
    if public:
        _say(
            f"development mode: the public dev {' and '.join(public)} token (loopback only); "
            f"set ${FLEET_TOKEN_ENV} / ${OPERATOR_TOKEN_ENV} or pass --*-token-file for your own"
        )
    env = dict(os.environ)
    env[FLEET_TOKEN_ENV] = credentials.fleet
    env[OPERATOR_TOKEN_ENV] = credentials.operator
    env[DEV_MODE_ENV] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- the command ------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the whole system on loopback: a controller, a heterogeneous fleet (fast v1, 0.6x "
        "straggler v1, and with --canary a faster v2) and a gateway, each its own process, "
        "supervised (a process that dies is restarted on the same ports). Prints the ports "
        "and ready-to-paste commands; Ctrl-C stops everything."
    )
    parser.add_argument("--canary", action="store_true", help="add a v2 replica on faster hardware")
    parser.add_argument(
        "--runtime",
        choices=("simulated", "onnx"),
        default="simulated",
        help="what the workers run: the calibrated simulated device, or a real byte-level "
        "decoder in ONNX Runtime (generated on first use into ~/.cache/halcyon, or "
        "$HALCYON_CACHE_DIR), on two threads for replica-a and one for replica-b "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--batching",
        choices=("halcyon", "fixed", "none"),
        default="halcyon",
        help="the gateway's batching: deadline-aware (halcyon), the seed's fixed 32 items / "
        "25 ms (fixed), or one request per batch (none) (default %(default)s)",
    )
    parser.add_argument(
        "--gateway-listen",
        type=hostport,
        metavar="HOST:PORT",
        default="127.0.0.1:50051",
        help="gateway gRPC address (default %(default)s)",
    )
    parser.add_argument(
        "--gateway-metrics-listen",
        type=hostport,
        metavar="HOST:PORT",
        default="127.0.0.1:9451",
        help="gateway /metrics address (default %(default)s)",
    )
    parser.add_argument(
        "--controller-listen",
        type=hostport,
        metavar="HOST:PORT",
        default="127.0.0.1:50050",
        help="controller gRPC address (default %(default)s)",
    )
    parser.add_argument(
        "--console-listen",
        type=hostport,
        metavar="HOST:PORT",
        default=None,
        help="the controller's operator console, a web page; loopback only (default: the "
        "controller's, 127.0.0.1:9440, or none when that port is taken)",
    )
    parser.add_argument(
        "--zero-device-time",
        action="store_true",
        help="workers take no device time (measures the gateway's own overhead); "
        "same as --intercept-ms 0 --ms-per-token 0",
    )
    parser.add_argument(
        "--intercept-ms",
        type=non_negative,
        metavar="MS",
        help="every worker's fixed cost per batch (default: the worker's, 18); a worker "
        "registers after measuring two warm-up batches, so with 5000 the fleet serves ~10 s "
        "after start",
    )
    parser.add_argument(
        "--ms-per-token",
        type=non_negative,
        metavar="MS",
        help="every worker's marginal cost per token (default: the worker's, 0.022)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="controller database, logs and the operator-token file; kept at exit "
        "(default: a temporary directory, removed at exit)",
    )
    parser.add_argument("--verbose", action="store_true", help="stream every process's logs here")
    add_credential_arguments(
        parser,
        fleet_use="shared by the stack's processes",
        operator_use="for the controller's operator API",
        dev_mode_flag=False,
    )


def _make_state_dir(args: argparse.Namespace) -> Path:
    if args.state_dir is not None:
        state_dir: Path = args.state_dir.resolve()
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    else:
        remove_stale_state_dirs()
        state_dir = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
    (state_dir / PID_FILE).write_text(f"{os.getpid()}\n")
    return state_dir


def run(args: argparse.Namespace) -> int:
    try:
        _check_runtime(args)
        _check_ports(args)
        env = _child_env(args)
    except (StackError, CredentialError) as err:
        print(f"stack: {err}", file=sys.stderr)
        return 2
    state_dir = _make_state_dir(args)
    _write_private(state_dir / OPERATOR_TOKEN_FILE, env[OPERATOR_TOKEN_ENV])
    stack = Stack(args, state_dir, env)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stack.signals.handler)
    code = 0
    try:
        stack.start()
        print(stack.describe(), flush=True)
        stack.supervise()
        _say(f"\n{stack.signals.last}: stopping (again to hurry)…")
    except _StopRequested:
        _say(f"\n{stack.signals.last} while starting: stopping…")
    except StackError as err:
        _say(f"stack: {err}")
        code = 1
    finally:
        stack.stop()
        if args.state_dir is None:
            shutil.rmtree(state_dir, ignore_errors=True)
        else:
            (state_dir / PID_FILE).unlink(missing_ok=True)
    return code
