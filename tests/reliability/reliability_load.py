"""Load for the reliability scenarios: the real ``halcyon loadtest --json``, as a subprocess.

What it decides: how a scenario starts load, learns when the load really began, and turns the
loadtest's report into a row of the table.

When the load began matters because faults are injected "N s into the load" and recovery is
read off the loadtest's per-second timeline, which counts from the loadtest's own start — a
moment the parent cannot see (the child's imports and connect take a variable ~0.5 s). The
anchor is the gateway's own count of Infer calls started (``grpc_server_started_total``): the
first increase after the loadtest is launched is its first request, sent at its start. It is
polled every 20 ms, so the anchor is late by at most that plus one scrape (~5 ms); the scenario
must send nothing else to that gateway before the anchor is taken.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from reliability_fleet import Proc, sample, scrape
from reliability_table import (
    OK,
    Row,
    Window,
    lost_outcomes,
    recovery_time,
    windows_from_timeline,
)

from common.errors import parse_rpc_error
from halcyon.tools.loadtest import is_halcyon_answer

ANCHOR_POLL_S = 0.02
# How long the loadtest may take to connect and send its first request.
ANCHOR_TIMEOUT_S = 30.0
# How long past --seconds the loadtest may take to drain and report before it is killed:
# outstanding calls end by their 2 s deadline, plus interpreter start and exit.
EXIT_SLACK_S = 45.0


def calls_started(gateway: Proc) -> float:
    """Infer calls the gateway has started, from its /metrics."""
    return sample(scrape(gateway), "grpc_server_started_total", grpc_method="Infer")


@dataclass
class LoadResult:
    """A finished loadtest: its ``--json`` report and when (monotonic) its load began."""

    report: dict[str, Any]
    started: float
    seconds: float

    def windows(self) -> list[Window]:
        """The timeline's full 1 s windows within the load (not the drain after it)."""
        return [
            w
            for w in windows_from_timeline(self.report["timeline"])
            if w.start_s + 1.0 <= self.seconds
        ]

    def row(self, scenario: str, *, fault_at_s: float | None = None) -> Row:
        """The table row: counts and goodput from the report; recovery from the timeline when
        a fault was injected ``fault_at_s`` seconds into the load."""
        r = self.report
        rejected: dict[str, int] = r["rejected"]
        return Row(
            scenario=scenario,
            requests=int(r["requests"]),
            answered=int(r["answered"]),
            goodput_rps=float(r["goodput_rps"]),
            p99_ms=float(r["p99_ms"]),
            sheds=dict(sorted(rejected.items(), key=lambda kv: -kv[1])),
            recovery_s=None if fault_at_s is None else recovery_time(self.windows(), fault_at_s),
            lost_detail=lost_outcomes(r["outcomes"]),
        )

    @property
    def rejected(self) -> dict[str, int]:
        return dict(self.report["rejected"])

    @property
    def goodput_rps(self) -> float:
        return float(self.report["goodput_rps"])

    def serving_ok_rps(self) -> float:
        """OK answers per second while the load ran: the timeline's full seconds after the
        first (the queue filling), not the drain after it. The report's ``success_rps`` counts
        over the run's wall time, drain included, which weighs a short run down more than a
        long one."""
        steady = [w.ok for w in self.windows() if w.start_s >= 1.0]
        return sum(steady) / len(steady) if steady else 0.0

    @property
    def p50_ms(self) -> float:
        value = float(self.report["p50_ms"])
        return value if not math.isnan(value) else math.inf


class Load:
    """One ``halcyon loadtest --json`` run against ``target``, anchored on ``gateway``.

    ``with Load(...) as load:`` starts it and waits for its first request; leaving the block
    kills it if it is still running (a failed scenario must not leave load behind).
    """

    def __init__(
        self,
        target: str,
        gateway: Proc,
        workdir: Path,
        *,
        name: str,
        seconds: float,
        clients: int | None = 32,
        rate: float | None = None,
        deadline_ms: float = 2000.0,
        extra: tuple[str, ...] = (),
        niceness: int = 0,
    ) -> None:
        self.gateway = gateway
        self.seconds = seconds
        self.stderr_path = workdir / f"{name}.loadtest.err"
        self.argv = [
            *(("nice", "-n", str(niceness)) if niceness else ()),
            sys.executable, "-m", "halcyon", "loadtest", "--json",
            "--target", target,
            "--seconds", f"{seconds:g}",
            "--deadline-ms", f"{deadline_ms:g}",
            *(("--rate", f"{rate:g}") if rate else ("--clients", str(clients))),
            *extra,
        ]  # fmt: skip
        self.popen: subprocess.Popen[str] | None = None
        self.started = math.nan

    # -- running ------------------------------------------------------------------------------

    def __enter__(self) -> Load:
        before = calls_started(self.gateway)
        with open(self.stderr_path, "w") as err:
            self.popen = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True
            )
        give_up = time.monotonic() + ANCHOR_TIMEOUT_S
        while calls_started(self.gateway) <= before:
            if self.popen.poll() is not None or time.monotonic() > give_up:
                raise AssertionError(f"the loadtest sent nothing: {self._describe()}")
            time.sleep(ANCHOR_POLL_S)
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def now(self) -> float:
        """Seconds since the load began."""
        return time.monotonic() - self.started

    def sleep_until(self, seconds_into_load: float) -> float:
        """Sleep until that many seconds into the load; returns the exact time reached."""
        time.sleep(max(0.0, seconds_into_load - self.now()))
        return self.now()

    def result(self) -> LoadResult:
        """Wait for the loadtest to finish (bounded) and parse its report."""
        assert self.popen is not None, "use Load as a context manager"
        try:
            out, _ = self.popen.communicate(timeout=self.seconds + EXIT_SLACK_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)
            raise AssertionError(f"the loadtest did not finish: {self._describe()}") from None
        if self.popen.returncode != 0:
            raise AssertionError(f"the loadtest failed: {self._describe()}")
        return LoadResult(json.loads(out), self.started, self.seconds)

    def _describe(self) -> str:
        code = self.popen.poll() if self.popen is not None else None
        try:
            err = self.stderr_path.read_text(errors="replace")[-2000:]
        except OSError:
            err = ""
        return f"{' '.join(self.argv)} (exit {code}); stderr:\n{err}"


def outcome_key(err: grpc.RpcError | None) -> str:
    """One call's outcome as the loadtest keys it: ``OK``, ``CODE/REASON`` for a Halcyon
    status, the bare ``CODE`` for anything else (lost)."""
    if err is None:
        return OK
    rich = parse_rpc_error(err)
    return f"{rich.code.name}/{rich.reason}" if is_halcyon_answer(rich) else rich.code.name
