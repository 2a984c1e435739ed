"""``halcyon stack``: the whole system on loopback, one process per component.

Starts a controller, a deliberately heterogeneous fleet (a fast v1 replica, a 0.6x straggler
v1 replica, and with ``--canary`` a v2 replica on faster hardware) and a gateway, each as its
own ``halcyon`` process. Identical replicas make any load balancer look good; this fleet does
not. Every child writes a ready file once it has bound its ports, so the stack knows the real
addresses; logs go to files under the state directory unless ``--verbose``. Ctrl-C or SIGTERM
stops everything: gateway first (so no accepted request is lost), then workers, then the
controller.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from common.argtypes import non_negative

MODEL = "llama-3-8b"


@dataclass(frozen=True)
class ReplicaSpec:
    replica_id: str
    version: str
    hardware: str
    speed: float


BASE_FLEET = (
    ReplicaSpec("replica-a", "v1", "a10g", 1.0),
    ReplicaSpec("replica-b", "v1", "t4", 0.6),
)
CANARY = ReplicaSpec("replica-c", "v2", "h100", 1.6)


def _flags(**values: object) -> list[str]:
    """``_flags(metrics_listen="x")`` -> ``["--metrics-listen", "x"]``."""
    out: list[str] = []
    for key, value in values.items():
        out += ["--" + key.replace("_", "-"), str(value)]
    return out


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    ready_file: Path
    log: IO[bytes] | None
    ready: dict[str, Any] | None = None


class Stack:
    """Starts children in dependency order and stops them in reverse."""

    def __init__(self, args: argparse.Namespace, state_dir: Path) -> None:
        self.args = args
        self.state_dir = state_dir
        self.children: list[Child] = []

    def spawn(self, name: str, argv: list[str]) -> Child:
        ready_file = self.state_dir / f"{name}.ready.json"
        ready_file.unlink(missing_ok=True)
        log: IO[bytes] | None = None
        stderr: int | IO[bytes] | None = None
        if not self.args.verbose:
            log = open(self.state_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
            stderr = log
        cmd = [sys.executable, "-m", "halcyon", *argv, "--ready-file", str(ready_file)]
        proc = subprocess.Popen(cmd, stdout=stderr, stderr=stderr, start_new_session=True)
        child = Child(name, proc, ready_file, log)
        self.children.append(child)
        return child

    def wait_ready(self, child: Child, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.proc.poll() is not None:
                raise RuntimeError(
                    f"{child.name} exited with code {child.proc.returncode} before it was ready"
                    + self._log_hint(child)
                )
            if child.ready_file.exists():
                with contextlib.suppress(json.JSONDecodeError):
                    child.ready = json.loads(child.ready_file.read_text())
                    return child.ready
            time.sleep(0.05)
        raise RuntimeError(
            f"{child.name} was not ready within {timeout_s:.0f} s" + self._log_hint(child)
        )

    def _log_hint(self, child: Child) -> str:
        if child.log is None:
            return ""
        path = self.state_dir / f"{child.name}.log"
        tail = path.read_text(errors="replace").strip().splitlines()[-5:]
        return f"; last log lines ({path}):\n    " + "\n    ".join(tail)

    def start(self) -> None:
        a = self.args
        tokens = ["--fleet-token", a.fleet_token]
        ctl = self.spawn(
            "controller",
            [
                "controller",
                "--listen", a.controller_listen,
                "--metrics-listen", "127.0.0.1:0",
                "--db", str(self.state_dir / "controller.sqlite"),
                "--stable", f"{MODEL}=v1",
                *tokens,
                "--operator-token", a.operator_token,
            ],
        )  # fmt: skip
        controller = self.wait_ready(ctl)["grpc"]
        fleet = list(BASE_FLEET) + ([CANARY] if a.canary else [])
        if a.zero_device_time:
            a.intercept_ms, a.ms_per_token = 0.0, 0.0
        device = []
        if a.intercept_ms is not None:
            device += ["--intercept-ms", str(a.intercept_ms)]
        if a.ms_per_token is not None:
            device += ["--ms-per-token", str(a.ms_per_token)]
        workers = []
        for i, spec in enumerate(fleet):
            argv = _flags(
                listen="127.0.0.1:0",
                metrics_listen="127.0.0.1:0",
                replica_id=spec.replica_id,
                model=MODEL,
                version=spec.version,
                hardware=spec.hardware,
                speed=spec.speed,
                seed=1000 + i,
                controller=controller,
            )
            workers.append(self.spawn(spec.replica_id, ["worker", *argv, *device, *tokens]))
        for w in workers:
            self.wait_ready(w)
        gw = self.spawn(
            "gateway",
            [
                "gateway",
                "--listen", a.gateway_listen,
                "--metrics-listen", a.gateway_metrics_listen,
                "--controller", controller,
                *tokens,
            ],
        )  # fmt: skip
        self.wait_ready(gw)

    def stop(self) -> None:
        # Reverse order: the gateway drains first so nothing accepted is lost.
        for child in reversed(self.children):
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
                try:
                    child.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.proc.kill()
                    child.proc.wait()
            if child.log:
                child.log.close()

    def describe(self) -> str:
        by_name = {c.name: c.ready or {} for c in self.children}
        grpcurl = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
        gateway = by_name["gateway"].get("grpc", self.args.gateway_listen)
        controller = by_name["controller"].get("grpc", self.args.controller_listen)
        rows = [f"  {'process':<12} {'gRPC':<22} {'metrics':<22} pid"]
        for c in self.children:
            r = c.ready or {}
            rows.append(
                f"  {c.name:<12} {r.get('grpc', '?'):<22} {r.get('metrics', '-'):<22} {c.proc.pid}"
            )
        body = json.dumps(
            {"model": MODEL, "input": "hello", "max_output_tokens": 64, "timeout": "2s"}
        )
        return "\n".join(
            [
                "Halcyon stack is up (Ctrl-C stops everything).",
                "",
                *rows,
                "",
                f"State and logs: {self.state_dir}",
                "",
                "Send one request:",
                f"  {grpcurl} -plaintext -H 'x-api-key: demo-key-premium' \\",
                f"    -d '{body}' \\",
                f"    {gateway} halcyon.v1.InferService/Infer",
                "",
                "Drive real load:",
                f"  halcyon loadtest --target {gateway} --clients 32 --seconds 20",
                "",
                "Inspect the control plane:",
                f"  {grpcurl} -plaintext -H 'authorization: Bearer {self.args.operator_token}' \\",
                f"    {controller} halcyon.v1.ControlService/GetState",
                "",
                f'Health: {grpcurl} -plaintext -d \'{{"service":"readiness"}}\' '
                f"{gateway} grpc.health.v1.Health/Check",
            ]
        )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the whole system on loopback: a controller, a heterogeneous fleet (fast v1, 0.6x "
        "straggler v1, and with --canary a faster v2) and a gateway, each its own process. "
        "Prints the ports and a ready-to-paste grpcurl call; Ctrl-C stops everything."
    )
    parser.add_argument("--canary", action="store_true", help="add a v2 replica on faster hardware")
    parser.add_argument("--gateway-listen", default="127.0.0.1:50051", help="gateway gRPC address")
    parser.add_argument(
        "--gateway-metrics-listen", default="127.0.0.1:9451", help="gateway /metrics address"
    )
    parser.add_argument(
        "--controller-listen", default="127.0.0.1:50050", help="controller gRPC address"
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
        help="every worker's fixed cost per batch (default: the worker's, 18)",
    )
    parser.add_argument(
        "--ms-per-token",
        type=non_negative,
        metavar="MS",
        help="every worker's marginal cost per token (default: the worker's, 0.022)",
    )
    parser.add_argument(
        "--state-dir", type=Path, help="controller database and logs (default: temp)"
    )
    parser.add_argument(
        "--fleet-token",
        default=os.environ.get("HALCYON_FLEET_TOKEN", "dev-fleet-token"),
        help="fleet credential shared by the stack's processes (env HALCYON_FLEET_TOKEN)",
    )
    parser.add_argument(
        "--operator-token",
        default=os.environ.get("HALCYON_OPERATOR_TOKEN", "dev-operator-token"),
        help="operator credential for the controller (env HALCYON_OPERATOR_TOKEN)",
    )
    parser.add_argument("--verbose", action="store_true", help="stream every process's logs here")


def run(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="halcyon-stack-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(args, state_dir)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
        print(stack.describe(), flush=True)
        while True:
            for child in stack.children:
                if child.proc.poll() is not None:
                    print(
                        f"\n{child.name} exited with code {child.proc.returncode}; stopping "
                        f"the stack (logs in {state_dir})",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping…", file=sys.stderr)
        return 0
    except RuntimeError as err:
        print(f"stack: {err}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
