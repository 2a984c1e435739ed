"""``halcyon rollout verify``: prove the rollout controller on a running stack, live.

What it decides: the experiment. Under steady open-loop load it ships four candidates in
turn and checks each ends as it must:

1. **faster** — the fastest registered version that is not stable and is faster than the
   stable one (the stack's v2 on a 1.6x device, against v1 on a 1.0x and a 0.6x device):
   promoted to 100 % on evidence;
2. **faulty** — a worker it starts that fails 5 % of its batches (``--fail-rate 0.05``):
   rolled back, reason ``error_rate``;
3. **slow** — a worker it starts with a 1.5x slowdown (``--slowdown 1.5``): rolled back on
   latency (reason ``latency``, or ``latency_rank`` when the rank test proves it first);
4. **aa** — an A/A pair: the baseline's own behaviour under a new name (``<baseline>-aa``),
   with transient batch faults (``--aa-fail-rate``, 1 % of batches) on *both* arms: promoted.
   It proves the judge does not roll back a canary for the faults its baseline has too.

Order and baseline: the faster candidate goes first, so the others are judged against its
promoted version — one replica on one kind of device. The workers it starts copy that
replica's speed and hardware, so the only difference the judge can see is the fault injected;
judged against v1 (a 1.0x and a 0.6x replica) a 1.5x-slow 1.0x replica would be no slower than
the straggler already in the baseline. The steps (20 then 50 %) end on an equal split so,
whatever happened at 20 %, each arm's replica carries the same load when it matters; short
windows keep the whole run around a minute and a half.

The A/A pair is a true one: verify starts a *twin* of the baseline version with the same
``--fail-rate``, waits until the gateway sends it work, then drains the stack's own baseline
replica(s) (``DrainReplica``, the operator credential) so the baseline arm is served by the
faulty twin alone, and ships the aa candidate with that same rate. It goes last so the faulty
and slow candidates are judged against a fault-free baseline. Afterwards, whatever happened:
if aa was promoted the baseline version is made stable again (an operator promote) while the
aa worker still serves; the aa worker stops; the drained replicas are undrained and verify
waits for them to serve before it stops the twin — so the stable version always has a replica.

Load is open loop (Poisson, ``--rate``) with a fresh session key per request, so each arm's
share of requests is its weight. Outcomes seen by this client are tallied per candidate — the
requests that failed while a candidate was live are what a user would have seen.

It starts the extra workers itself (the fleet credential goes to them in the environment,
never on a command line; :mod:`halcyon.tools.rollout_verify_workers`), stops every one of them and
undrains every replica it drained whatever happens (Ctrl-C and SIGTERM included), prints the
decision trails and a summary, and — unless ``--keep-promoted`` — gives the model back its
original stable version at the end (a rollout of it promoted at once by the operator), so it
can run again. Exit 0 only if all four ended as expected; 3 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import IO, Any

import grpc

from common import keepalive
from common.argtypes import hostport, positive, probability
from common.credentials import DEV_FLEET_TOKEN, FLEET_TOKEN_ENV
from common.durations import to_duration
from common.errors import parse_rpc_error
from halcyon.tools.operator_cli import CliError, Console, as_dict, read_secret, table
from halcyon.tools.rollout_display import (
    ACTION_NAMES,
    EXIT_NOT_PROMOTED,
    TERMINAL_ACTIONS,
    count_at_least,
    parse_steps,
    stream_header,
    stream_row,
)
from halcyon.tools.rollout_verify_workers import Drains, Workers
from halcyon.v1 import control_pb2, infer_pb2, infer_pb2_grpc

__all__ = ["configure", "verify"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--gateway",
        type=hostport,
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="gateway to drive load at (default 127.0.0.1:50051)",
    )
    parser.add_argument("--model", default="llama-3-8b", help="model (default llama-3-8b)")
    parser.add_argument(
        "--api-key", default="demo-key-premium", help="tenant API key (default demo-key-premium)"
    )
    parser.add_argument(
        "--rate", type=positive, default=150.0, metavar="RPS", help="load, req/s (default 150)"
    )
    parser.add_argument(
        "--faster-version",
        metavar="VERSION",
        help="the faster candidate (default: the fastest registered non-stable version)",
    )
    parser.add_argument(
        "--fleet-token-file",
        type=Path,
        metavar="PATH",
        help=f"fleet token for the workers it starts (default ${FLEET_TOKEN_ENV}, else the dev "
        "token)",
    )
    parser.add_argument(
        "--steps",
        type=parse_steps,
        default=[20.0, 50.0],
        metavar="P,P",
        help="canary steps (default 20,50)",
    )
    parser.add_argument(
        "--window", type=positive, default=3.0, metavar="SECONDS", help="window (default 3)"
    )
    parser.add_argument(
        "--min-requests",
        type=count_at_least(1),
        default=40,
        metavar="N",
        help="per arm per window (default 40)",
    )
    parser.add_argument(
        "--fail-rate",
        type=probability,
        default=0.05,
        metavar="P",
        help="batch failure rate of the faulty candidate (default 0.05)",
    )
    parser.add_argument(
        "--slowdown",
        type=positive,
        default=1.5,
        metavar="X",
        help="slowdown of the slow candidate (default 1.5)",
    )
    parser.add_argument(
        "--aa-fail-rate",
        type=probability,
        default=0.01,
        metavar="P",
        help="batch failure rate on both arms of the A/A candidate (default 0.01): a twin of "
        "the baseline with these faults serves the baseline arm, the baseline's own replicas "
        "drained meanwhile, and the candidate is the same worker under a new version name; its "
        "promotion proves the judge does not roll back a canary for faults its baseline has too",
    )
    parser.add_argument(
        "--rollout-timeout",
        type=positive,
        default=60.0,
        metavar="SECONDS",
        help="give a candidate this long to reach a decision (default 60)",
    )
    parser.add_argument(
        "--keep-promoted",
        action="store_true",
        help="leave the faster candidate stable instead of restoring the original at the end",
    )
    parser.add_argument(
        "--state-dir", type=Path, help="logs of the workers it starts (default: a temp dir)"
    )


# -- load -------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What this client saw while one candidate was live."""

    ok: Counter[str] = field(default_factory=Counter)  # by answering version
    failed: Counter[str] = field(default_factory=Counter)  # by status / reason

    @property
    def total(self) -> int:
        return sum(self.ok.values()) + sum(self.failed.values())


class Load:
    """Open-loop Poisson load on a thread, one fresh session key per request."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._rate = args.rate
        self._channel = grpc.insecure_channel(args.gateway, keepalive.client_options())
        self._stub = infer_pb2_grpc.InferServiceStub(self._channel)
        self._metadata = (("x-api-key", args.api_key),)
        self._model = args.model
        self._rng = random.Random(20_260_101)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._outstanding = 0
        self._seq = 0
        self.tally = Tally()
        self._thread = threading.Thread(target=self._run, name="verify-load", daemon=True)

    def start(self, connect_timeout_s: float = 10.0) -> None:
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout_s)
        except grpc.FutureTimeoutError:
            raise CliError("no gateway answered at the --gateway address") from None
        self._thread.start()

    def phase(self) -> Tally:
        """Start tallying a new phase; returns the previous one."""
        with self._lock:
            done, self.tally = self.tally, Tally()
        return done

    def _run(self) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            next_at += -math.log(1.0 - self._rng.random()) / self._rate
            delay = next_at - time.perf_counter()
            if delay > 0 and self._stop.wait(delay):
                return
            if self._outstanding > 2000:
                continue  # the gateway is not answering: do not pile up more
            self._seq += 1
            request = infer_pb2.InferRequest(
                model=self._model,
                input="verify the rollout controller",
                max_output_tokens=self._rng.randint(64, 255),
                session_key=f"verify-{os.getpid()}-{self._seq}",
            )
            with self._lock:
                self._outstanding += 1
            future = self._stub.Infer.future(request, timeout=2.0, metadata=self._metadata)
            future.add_done_callback(self._done)

    def _done(self, future: grpc.Future) -> None:
        err = future.exception()
        with self._lock:
            self._outstanding -= 1
            if err is None:
                self.tally.ok[future.result().version] += 1
            else:
                assert isinstance(err, grpc.RpcError)
                rich = parse_rpc_error(err)
                self.tally.failed[rich.code.name + (f"/{rich.reason}" if rich.reason else "")] += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        deadline = time.monotonic() + 3.0
        while self._outstanding and time.monotonic() < deadline:
            time.sleep(0.02)
        self._channel.close()


# -- the experiment ---------------------------------------------------------------------------


@dataclass
class Outcome:
    """How one candidate ended, against what was expected."""

    name: str
    version: str
    expected: str
    action: str = "no decision"
    reason: str = ""
    seconds: float = 0.0
    trail: list[control_pb2.RolloutDecision] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)

    @property
    def passed(self) -> bool:
        if self.expected == "promote":
            return self.action == "promote"
        want = "error_rate" if self.name == "faulty" else "latency"
        return self.action == "rollback" and self.reason.startswith(want)


def _output(args: argparse.Namespace) -> IO[str]:
    """Trails go to stderr under --json, so stdout stays one JSON document."""
    return sys.stderr if args.json else sys.stdout


class Experiment:
    def __init__(
        self,
        console: Console,
        args: argparse.Namespace,
        load: Load,
        workers: Workers,
        drains: Drains,
    ):
        self.console = console
        self.args = args
        self.load = load
        self.workers = workers
        self.drains = drains
        self.model = args.model
        self.out = _output(args)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def state(self) -> control_pb2.GetStateResponse:
        state: control_pb2.GetStateResponse = self.console.call(
            self.console.stub.GetState, control_pb2.GetStateRequest()
        )
        return state

    def stable(self) -> str:
        for route in self.state().routing:
            if route.model == self.model and route.stable_version:
                return str(route.stable_version)
        raise CliError(f"model {self.model!r} has no stable version on this controller")

    def members(self, version: str | None = None) -> list[control_pb2.FleetMember]:
        return [
            m
            for m in self.state().replicas
            if m.replica.model == self.model
            and (version is None or m.replica.version == version)
            and not m.load.draining
        ]

    def faster_candidate(self, stable: str) -> str:
        speeds: dict[str, list[float]] = {}
        for m in self.members():
            speeds.setdefault(m.replica.version, []).append(m.replica.speed)
        if stable not in speeds:
            raise CliError(f"the stable version {stable} of {self.model} has no live replica")
        base = fmean(speeds[stable])
        if self.args.faster_version:
            if self.args.faster_version not in speeds:
                raise CliError(f"--faster-version {self.args.faster_version} has no live replica")
            return str(self.args.faster_version)
        faster = sorted((fmean(s), v) for v, s in speeds.items() if v != stable and fmean(s) > base)
        if not faster:
            slower = sorted(v for v in speeds if v != stable)
            back = (
                f"; if {slower[0]} was stable before, put it back with `halcyon rollout start "
                f"{self.model} {slower[0]}` then `halcyon rollout promote {self.model}`"
                if slower
                else ""
            )
            raise CliError(
                f"no registered version of {self.model} is faster than the stable {stable} "
                f"(mean speed {base:g}); start the stack with --canary (a 1.6x v2) or a "
                f"faster worker, or name one with --faster-version{back}"
            )
        return faster[-1][1]

    def policy(self) -> control_pb2.RolloutPolicy:
        return control_pb2.RolloutPolicy(
            window=to_duration(self.args.window),
            min_requests=self.args.min_requests,
            max_duration=to_duration(self.args.rollout_timeout),
        )

    def ship(self, outcome: Outcome) -> Outcome:
        """Start a rollout of ``outcome.version`` and follow it to its end."""
        steps = self.args.steps
        watch = self.console.stub.WatchRolloutDecisions(
            control_pb2.WatchRolloutDecisionsRequest(model=self.model),
            metadata=self.console.metadata,
            timeout=self.args.rollout_timeout + 30.0,
        )
        self.say(f"\n== {outcome.name}: {outcome.version} (expect {outcome.expected})")
        self.say(stream_header())
        self.load.phase()
        started_at = time.monotonic()
        started: control_pb2.Rollout | None = None
        try:
            started = self.console.call(
                self.console.stub.StartRollout,
                control_pb2.StartRolloutRequest(
                    model=self.model,
                    canary_version=outcome.version,
                    step_percents=steps,
                    policy=self.policy(),
                ),
            ).rollout
            self._follow(watch, started.id, outcome)
        finally:
            watch.cancel()
            if started is not None and outcome.action == "no decision":
                # Timed out, interrupted or failed: leave no rollout of ours running.
                self._abort("halcyon rollout verify: stopped before a decision")
        outcome.seconds = time.monotonic() - started_at
        outcome.tally = self.load.phase()
        return outcome

    def _follow(self, watch: Any, rollout_id: int, outcome: Outcome) -> None:
        """Record the rollout's decisions until a terminal one (or the watch deadline)."""
        try:
            for item in watch:
                d = item.decision
                if d.rollout_id != rollout_id:
                    continue
                outcome.trail.append(d)
                self.say(stream_row(d))
                if d.action in TERMINAL_ACTIONS:
                    outcome.action = ACTION_NAMES[d.action]
                    outcome.reason = d.reason
                    return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                raise

    def _abort(self, why: str) -> None:
        with contextlib.suppress(grpc.RpcError):
            self.console.call(
                self.console.stub.AbortRollout,
                control_pb2.AbortRolloutRequest(model=self.model, reason=why),
            )

    def wait_registered(self, version: str) -> None:
        deadline = time.monotonic() + 15.0
        while not self.members(version):
            if time.monotonic() > deadline:
                raise CliError(f"the {version} worker did not register with the controller")
            time.sleep(0.1)

    def wait_serving(self, replica_id: str) -> None:
        """Until the controller shows ``replica_id`` has run batches: a gateway routes to it."""
        deadline = time.monotonic() + 15.0
        while not any(
            m.replica.replica_id == replica_id and m.load.batches_total > 0 for m in self.members()
        ):
            if time.monotonic() > deadline:
                raise CliError(f"{replica_id} registered but no gateway sent it a batch in 15 s")
            time.sleep(0.1)

    def restore(self, original: str) -> None:
        """Give the model back its original stable version: a rollout promoted at once."""
        if self.stable() == original:
            return
        if not self.members(original):
            self.say(f"note: {original} has no live replica; leaving {self.stable()} stable")
            return
        self.console.call(
            self.console.stub.StartRollout,
            control_pb2.StartRolloutRequest(model=self.model, canary_version=original),
        )
        self.console.call(
            self.console.stub.PromoteRollout, control_pb2.PromoteRolloutRequest(model=self.model)
        )
        self.say(f"\nrestored {original} as the stable version of {self.model} (operator promote)")

    def ship_aa(self, baseline: str, like: control_pb2.FleetMember) -> Outcome:
        """The A/A candidate: ``baseline`` under a new name, the same batch faults on both arms.

        The nesting is the cleanup order (module docstring): the aa version gives the stable
        place back while its worker serves, and the drained replicas serve again before the
        twin that covered for them is stopped."""
        version = f"{baseline}-aa"
        fault = ("--fail-rate", repr(self.args.aa_fail_rate))
        own = [m.replica.replica_id for m in self.members(baseline)]
        # Both start at once; the aa worker takes no traffic before its rollout starts.
        twin = self.workers.spawn(baseline, like, *fault, role="twin")
        aa = self.workers.spawn(version, like, *fault)
        try:
            self.workers.wait_ready(twin)
            self.wait_serving(twin.replica_id)
            try:
                for replica_id in own:
                    self.drains.drain(replica_id)
                self.workers.wait_ready(aa)
                self.wait_registered(version)
                return self.ship(Outcome("aa", version, "promote"))
            finally:
                try:
                    if self.stable() == version:
                        self.restore(baseline)
                finally:
                    self.drains.undrain_all()
        finally:
            self.workers.retire(aa, twin)

    def run(self) -> list[Outcome]:
        original = self.stable()
        running = [
            r
            for r in self.state().rollouts
            if r.model == self.model and r.state == control_pb2.ROLLOUT_STATE_PROGRESSING
        ]
        if running:
            raise CliError(
                f"{self.model} already has a running rollout (#{running[0].id}); abort it first"
            )
        faster = self.faster_candidate(original)
        self.load.start()
        outcomes = [self.ship(Outcome("faster", faster, "promote"))]
        baseline = self.stable()
        like = self.members(baseline)[0]
        for name, version, fault in (
            ("faulty", f"{baseline}-faulty", ("--fail-rate", repr(self.args.fail_rate))),
            ("slow", f"{baseline}-slow", ("--slowdown", repr(self.args.slowdown))),
        ):
            worker = self.workers.start(version, like, *fault)
            try:
                self.wait_registered(version)
                outcomes.append(self.ship(Outcome(name, version, "rollback")))
            finally:
                self.workers.retire(worker)
        outcomes.append(self.ship_aa(baseline, like))
        self.load.stop()
        if not self.args.keep_promoted:
            self.restore(original)
        return outcomes


def summary(outcomes: list[Outcome]) -> str:
    rows = []
    for o in outcomes:
        failed = sum(o.tally.failed.values())
        rows.append(
            [
                o.name,
                o.version,
                o.expected,
                f"{o.action} {o.reason}".strip(),
                f"{o.seconds:.1f}",
                f"{o.tally.ok[o.version]}",
                f"{failed} of {o.tally.total}",
                "PASS" if o.passed else "FAIL",
            ]
        )
    headers = (
        "candidate", "version", "expected", "outcome", "seconds to decide",
        "answered by the candidate", "requests failed (all versions)", "",
    )  # fmt: skip
    return table(headers, rows)


def verify(console: Console, args: argparse.Namespace) -> int:
    fleet_token = read_secret(args.fleet_token_file, FLEET_TOKEN_ENV, "fleet token")
    if fleet_token is None:
        print(
            f"warning: the workers get the insecure dev fleet token; set ${FLEET_TOKEN_ENV} "
            "or --fleet-token-file",
            file=sys.stderr,
        )
        fleet_token = DEV_FLEET_TOKEN
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="halcyon-verify-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    workers = Workers(args, state_dir, fleet_token)
    out = _output(args)
    drains = Drains(console, lambda text: print(text, file=out, flush=True))
    load = Load(args)
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        outcomes = Experiment(console, args, load, workers, drains).run()
    finally:
        load.stop()
        # Normally already done by the A/A candidate's own cleanup; after an error or a signal
        # in the middle of it, here: the drained replicas first, then the workers.
        try:
            drains.undrain_all(wait=False)
        finally:
            workers.stop_all()
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps([_outcome_json(o) for o in outcomes], sort_keys=True))
    else:
        print("\n" + summary(outcomes))
        print(f"\nworker logs: {state_dir}")
    return 0 if all(o.passed for o in outcomes) else EXIT_NOT_PROMOTED


def _outcome_json(o: Outcome) -> dict[str, Any]:
    return {
        "candidate": o.name,
        "version": o.version,
        "expected": o.expected,
        "action": o.action,
        "reason": o.reason,
        "seconds": round(o.seconds, 3),
        "passed": o.passed,
        "answered_by_candidate": o.tally.ok[o.version],
        "client_ok": dict(o.tally.ok),
        "client_failed": dict(o.tally.failed),
        "decisions": [as_dict(d) for d in o.trail],
    }
