"""What ``halcyon rollout verify`` changes in the fleet, and how it puts every change back.

What it decides: how the extra workers are started (a copy of a live replica's speed, hardware
and slots, a fault injected, a seed of their own) and stopped, and how the replicas it takes
out of service for the A/A candidate are drained and undrained. Both keep a list of what is
outstanding so a ``finally`` anywhere — a candidate's own, or the command's last one after
Ctrl-C / SIGTERM — can undo all of it, and undoing twice is harmless. The workers are started
and stopped by :mod:`halcyon.tools.launcher`, so they die with verify even when it is
SIGKILLed.

Kept apart from :mod:`halcyon.tools.rollout_verify` (the experiment) because it is the process and
fleet bookkeeping, not the judgement of any candidate.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from common.credentials import DEV_FLEET_TOKEN, DEV_MODE_ENV, FLEET_TOKEN_ENV
from halcyon.tools import launcher
from halcyon.tools.fleet_cmd import drained
from halcyon.tools.operator_cli import CliError, Console
from halcyon.v1 import control_pb2

__all__ = ["Drains", "Worker", "Workers"]

# How long a drain may take to settle (no batch in flight) or an undrain to show in GetState
# before verify goes on anyway; the heartbeat that reports either comes every second or so.
SETTLE_TIMEOUT_S = 10.0
POLL_S = 0.1
STOP_GRACE_S = 10.0  # a worker's drain delay and in-flight batches, then SIGKILL


@dataclass
class Worker:
    version: str
    proc: subprocess.Popen[bytes]
    ready_file: Path
    log_file: Path
    replica_id: str
    # SIGTERM sent: a second one would make it stop at once, skipping its drain delay.
    signalled: bool = False


class Workers:
    """The workers verify starts; :meth:`stop_all` stops every one of them."""

    def __init__(self, args: argparse.Namespace, state_dir: Path, fleet_token: str) -> None:
        self._args = args
        self._dir = state_dir
        self._env = {**os.environ, FLEET_TOKEN_ENV: fleet_token}
        if fleet_token == DEV_FLEET_TOKEN:
            # A worker accepts the public dev token only in development mode (loopback only),
            # which is what `halcyon stack` runs in.
            self._env[DEV_MODE_ENV] = "1"
        # One seed each: the A/A pair's faults must be drawn independently, not in lockstep.
        self._seeds = itertools.count(os.getpid() % 10_000)
        self._running: list[Worker] = []

    def start(
        self, version: str, like: control_pb2.FleetMember, *fault: str, role: str = ""
    ) -> Worker:
        """A worker of ``version`` like ``like`` with ``fault`` flags; ready when it returns."""
        worker = self.spawn(version, like, *fault, role=role)
        self.wait_ready(worker)
        return worker

    def spawn(
        self, version: str, like: control_pb2.FleetMember, *fault: str, role: str = ""
    ) -> Worker:
        """Start it without waiting (:meth:`wait_ready`), so two can start at once.

        ``role`` names it apart from another worker of the same version (the A/A twin)."""
        replica_id = f"verify-{version}{'-' + role if role else ''}-{os.getpid()}"
        ready = self._dir / f"{replica_id}.ready.json"
        log_file = self._dir / f"{replica_id}.log"
        argv = [
            "worker",
            "--controller", self._args.controller,
            "--listen", "127.0.0.1:0", "--metrics-listen", "off",
            "--replica-id", replica_id,
            "--model", like.replica.model,
            "--version", version,
            "--hardware", like.replica.hardware,
            "--speed", repr(like.replica.speed),
            "--slots", str(like.replica.slots or 1),
            "--seed", str(next(self._seeds)),
            *fault,
        ]  # fmt: skip
        # The fleet credential travels in the environment: never on a command line.
        proc = launcher.launch(argv, ready_file=ready, log_path=log_file, env=self._env)
        worker = Worker(version, proc, ready, log_file, replica_id)
        self._running.append(worker)
        return worker

    def wait_ready(self, worker: Worker, timeout_s: float = 20.0) -> None:
        try:
            launcher.wait_ready(worker.proc, worker.ready_file, timeout_s, poll_s=0.05)
        except launcher.NotReady as exc:
            if exc.returncode is None:
                raise CliError(
                    f"the {worker.version} worker was not ready within {timeout_s:g} s"
                ) from None
            raise CliError(
                f"the {worker.version} worker exited with {exc.returncode}; see {worker.log_file}"
            ) from None

    def retire(self, *workers: Worker) -> None:
        """SIGTERM without waiting: each serves on through its drain delay (5 s) and exits; the
        next candidate need not wait for that. Only for a worker no traffic depends on any
        more (rolled back, or its version's place given back); :meth:`stop_all` reaps it."""
        for worker in workers:
            if not worker.signalled and worker.proc.poll() is None:
                launcher.terminate(worker.proc)
                worker.signalled = True

    def stop(self, *workers: Worker) -> None:
        """SIGTERM them all at once (those not yet retired), then wait for each: its drain
        delay and in-flight batches (SIGKILL after 10 s)."""
        self.retire(*workers)
        for worker in workers:
            launcher.reap(worker.proc, STOP_GRACE_S)
            with contextlib.suppress(ValueError):
                self._running.remove(worker)

    def stop_all(self) -> None:
        self.stop(*self._running)


class Drains:
    """Replicas verify drained (``DrainReplica``, operator credential); :meth:`undrain_all`
    gives every one of them back. Only replicas it drained itself: one an operator had already
    drained is never in the list, so it stays drained."""

    def __init__(
        self,
        console: Console,
        say: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._console = console
        self._say = say
        self._clock = clock
        self._sleep = sleep
        self._drained: list[str] = []

    def _member(self, replica_id: str) -> control_pb2.FleetMember | None:
        state: control_pb2.GetStateResponse = self._console.call(
            self._console.stub.GetState, control_pb2.GetStateRequest()
        )
        for member in state.replicas:
            if member.replica.replica_id == replica_id:
                return member
        return None

    def drain(self, replica_id: str) -> None:
        """Drain it and wait (bounded) until its heartbeats say no batch of it is in flight, so
        the next rollout's first window holds none of its work."""
        answer = self._console.call(
            self._console.stub.DrainReplica,
            control_pb2.DrainReplicaRequest(replica_id=replica_id),
        )
        self._drained.append(replica_id)
        self._say(f"drained {replica_id} (verify undrains it when the A/A candidate is done)")
        last_lease = answer.replica.lease_expires_at.ToNanoseconds()
        heartbeats = 0
        deadline = self._clock() + SETTLE_TIMEOUT_S
        while self._clock() < deadline:
            member = self._member(replica_id)
            if member is None:
                return  # it left the fleet: nothing of it can be in flight
            lease = member.lease_expires_at.ToNanoseconds()
            if lease != last_lease:  # every heartbeat renews the lease
                heartbeats += 1
                last_lease = lease
            if drained(heartbeats, member):
                return
            self._sleep(POLL_S)
        self._say(f"note: {replica_id} still had batches in flight {SETTLE_TIMEOUT_S:g} s in")

    def undrain_all(self, *, wait: bool = True) -> None:
        """Undrain every replica it drained, newest first; with ``wait``, until GetState shows
        each serving again (bounded), so stopping whatever covered for them leaves no gap."""
        while self._drained:
            replica_id = self._drained[-1]
            try:
                self._console.call(
                    self._console.stub.UndrainReplica,
                    control_pb2.UndrainReplicaRequest(replica_id=replica_id),
                )
            except grpc.RpcError as exc:
                self._drained.pop()
                self._say(
                    f"warning: could not undrain {replica_id} ({exc.code().name}); "  # type: ignore[attr-defined]
                    f"run `halcyon fleet undrain {replica_id}`"
                )
                continue
            # Off the list only once the undrain was sent: interrupted in the call, it is
            # still there for the command's last cleanup to send again (a no-op if it landed).
            self._drained.pop()
            self._say(f"undrained {replica_id}")
            deadline = self._clock() + SETTLE_TIMEOUT_S
            while wait and self._clock() < deadline:
                member = self._member(replica_id)
                if member is None or not member.load.draining:
                    break
                self._sleep(POLL_S)
