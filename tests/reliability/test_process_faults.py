"""Processes that die, fail, freeze or go away while 32 clients keep the fleet busy.

One fleet for the module — a controller, three workers with real (simulated) device time, so
batches are in flight when a fault lands, and a gateway — started as a deployment would run it
(workers with the default 10 s reconnect backoff). Each scenario leaves it whole again for the
next: a killed worker is restarted under its replica id, a stopped one continued, a killed
controller restarted on its port and SQLite file, an extra worker or gateway stopped.

Every scenario runs ``halcyon loadtest`` (closed loop, 32 clients, 2 s deadlines), injects its
fault a few seconds in, and records a row: how every request ended, goodput, p99, sheds by
reason and recovery time. Beyond "no request lost", each asserts its own property.
"""

from __future__ import annotations

import http.client
import math
import signal
import time
from typing import Any

import grpc
import pytest
from reliability_fleet import (
    API_KEY,
    DEFAULT_BACKOFF,
    MODEL,
    restart_worker,
    sample,
    scrape,
    wait_mid_batch,
)
from reliability_load import Load, LoadResult, calls_started, outcome_key
from reliability_table import is_answer

from halcyon.v1 import infer_pb2

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(150)]

WORKERS = ("replica-a", "replica-b", "replica-c")
CLIENTS = 32
LEASE_TTL_S = 3.0  # the launcher's controller --lease-ttl
# What "the fleet kept serving" means under a fault: at most this share of requests not OK.
MAX_FAILED_SHARE = 0.01


@pytest.fixture(scope="module")
def fleet(launcher: Any) -> Any:
    return launcher.fleet({rid: DEFAULT_BACKOFF for rid in WORKERS})


@pytest.fixture
def whole(fleet: Any) -> Any:
    """The fleet, with every worker registered and in the gateway's view."""
    fleet.wait_converged()
    return fleet


def _load(launcher: Any, fleet: Any, name: str, seconds: float, **kw: Any) -> Load:
    target = kw.pop("target", fleet.gateway.grpc)
    gateway = kw.pop("gateway", fleet.gateway)
    return Load(
        target, gateway, launcher.workdir, name=name, seconds=seconds, clients=CLIENTS, **kw
    )


def _failed_share(result: LoadResult) -> float:
    r = result.report
    return 1.0 - r["ok"] / r["requests"] if r["requests"] else 1.0


def _check_served(result: LoadResult, failures: list[str]) -> None:
    share = _failed_share(result)
    if share > MAX_FAILED_SHARE:
        failures.append(
            f"{100 * share:.2f} % of requests not OK (at most {100 * MAX_FAILED_SHARE:g} %): "
            f"{result.report['outcomes']}"
        )


def test_worker_kill_9_mid_batch(launcher: Any, whole: Any, scoreboard: Any) -> None:
    victim = whole.workers["replica-b"]
    try:
        with _load(launcher, whole, "kill9", seconds=10) as load:
            load.sleep_until(3.0)
            wait_mid_batch(victim)
            fault_at = load.now()
            victim.kill()
            result = load.result()
    finally:
        if not victim.alive:  # the next scenarios need the whole fleet
            restart_worker(launcher, whole, "replica-b")
    row = result.row("worker kill -9 mid-batch", fault_at_s=fault_at)
    _check_served(result, row.failures)
    assert row.recovery_s is not None
    if row.recovery_s > LEASE_TTL_S + 1.0:
        row.failures.append(f"recovery {row.recovery_s:.1f} s > lease TTL + 1 s")
    scoreboard.check(row)


def _batches(worker: Any) -> float:
    """ExecuteBatch calls the worker has taken, however they ended."""
    return float(sample(scrape(worker), "halcyon_worker_batches_total"))


def test_black_hole_worker(launcher: Any, whole: Any, scoreboard: Any) -> None:
    # The healthy fleet's goodput is measured before and after, under the same load, and the
    # two are averaged: the machine's speed drifts over seconds, and bracketing cancels a drift.
    healthy = [_healthy_goodput(launcher, whole, "black-hole-before")]
    hole = launcher.worker(
        whole.controller, "black-hole", "--fail-rate", "1", "--fail-fast-ms", "2", *DEFAULT_BACKOFF
    )
    hole.wait_ready()
    whole.workers["black-hole"] = hole
    try:
        whole.wait_converged()
        procs = list(whole.workers.values())
        with _load(launcher, whole, "black-hole", seconds=8) as load:
            first = {p.name: _batches(p) for p in procs}
            load.sleep_until(2.0)  # the breaker has opened by now
            mid = {p.name: _batches(p) for p in procs}
            result = load.result()
        end = {p.name: _batches(p) for p in procs}
    finally:
        whole.workers.pop("black-hole")
        hole.stop()
    whole.wait_converged()
    healthy.append(_healthy_goodput(launcher, whole, "black-hole-after"))
    baseline = sum(healthy) / len(healthy)

    row = result.row("black-hole worker (fails all in 2 ms)")
    sent = end["black-hole"] - mid["black-hole"]
    total = sum(end.values()) - sum(mid.values())
    share = sent / total if total else 1.0
    row.notes.append(
        f"batches to the black hole: {end['black-hole'] - first['black-hole']:.0f} in the run, "
        f"{sent:.0f} of {total:.0f} ({100 * share:.2f} %) after its first 2 s; goodput "
        f"{result.goodput_rps:.1f}/s against {baseline:.1f}/s without it "
        f"({healthy[0]:.1f} before, {healthy[1]:.1f} after)"
    )
    if share >= 0.01:
        row.failures.append(f"{100 * share:.2f} % of batches went to the black hole (< 1 %)")
    if result.goodput_rps < 0.9 * baseline:
        row.failures.append(
            f"goodput {result.goodput_rps:.1f}/s is not within 10 % of the healthy fleet's "
            f"{baseline:.1f}/s"
        )
    _check_served(result, row.failures)
    scoreboard.check(row)


def _healthy_goodput(launcher: Any, fleet: Any, name: str) -> float:
    with _load(launcher, fleet, name, seconds=5) as load:
        return load.result().goodput_rps


HANG_S = 5.0


def test_hung_worker(launcher: Any, whole: Any, scoreboard: Any) -> None:
    victim = whole.workers["replica-c"]
    try:
        with _load(launcher, whole, "hung", seconds=12) as load:
            load.sleep_until(3.0)
            wait_mid_batch(victim)
            fault_at = load.now()
            victim.send(signal.SIGSTOP)
            load.sleep_until(fault_at + HANG_S)
            victim.send(signal.SIGCONT)
            result = load.result()
    finally:
        victim.send(signal.SIGCONT)
    row = result.row(f"hung worker (SIGSTOP {HANG_S:g} s)", fault_at_s=fault_at)
    row.notes.append(f"hedge rate {100 * result.report['hedge_rate']:.2f} %")
    _check_served(result, row.failures)
    scoreboard.check(row)


REREGISTER_WAIT_S = 20.0


def _all_registered(fleet: Any) -> bool:
    try:
        return bool(fleet.replica_ids() == set(fleet.workers))
    except grpc.RpcError:  # the new controller may refuse a moment longer
        return False


def test_controller_sigkill_and_restart(launcher: Any, whole: Any, scoreboard: Any) -> None:
    try:
        with _load(launcher, whole, "controller-restart", seconds=12) as load:
            load.sleep_until(3.0)
            fault_at = load.now()
            whole.controller.kill()
            load.sleep_until(fault_at + 2.0)
            launcher.restart(whole.controller)  # same flags, port and SQLite file; then ready
            restarted_at = time.monotonic()
            give_up = restarted_at + REREGISTER_WAIT_S
            while not _all_registered(whole) and time.monotonic() < give_up:
                time.sleep(0.05)
            reestablished_s = time.monotonic() - restarted_at
            result = load.result()
    finally:
        if not whole.controller.alive:  # the next scenarios need a controller
            launcher.restart(whole.controller)
    row = result.row("controller SIGKILL, restart 2 s later", fault_at_s=fault_at)
    row.notes.append(
        f"every worker registered again {reestablished_s:.1f} s after the new controller was ready"
        if reestablished_s < REREGISTER_WAIT_S
        else f"not every worker registered again within {REREGISTER_WAIT_S:g} s"
    )
    if "NO_CAPACITY" in result.rejected:
        row.failures.append(
            f"{result.rejected['NO_CAPACITY']} NO_CAPACITY: the gateway dropped its fleet"
        )
    if reestablished_s > LEASE_TTL_S:
        row.failures.append(
            f"workers registered again {reestablished_s:.1f} s after the restart (> lease TTL)"
        )
    _check_served(result, row.failures)
    scoreboard.check(row)


# The leaving gateway's drain delay: long enough for health-checking clients to see readiness
# NOT_SERVING and stop picking it (gRPC reacts within ~0.3 s), short enough for the suite.
DRAIN_DELAY_S = 1.0
ARRIVALS_POLL_S = 0.05
# How the load's clients pick a gateway: as the README tells them to (round_robin with health
# checks on readiness), or gRPC's default (pick_first: one address until it goes away).
HEALTH_CHECKING = "health-checking"
PICK_FIRST = "pick_first"


def _arrivals_until_stop(gateway: Any, since: float, count: float) -> tuple[float | None, int]:
    """Poll the gateway's count of started Infer calls, ``count`` at ``since`` (monotonic),
    until its /metrics goes away (it stops) or it exits: when, in seconds after ``since``, the
    count last grew (None: not once), and by how much it grew in all."""
    last_growth: float | None = None
    first = count
    while gateway.alive:
        try:
            now_count = calls_started(gateway)
        # /metrics closed, or cut off mid-response (IncompleteRead): the server has stopped.
        except (OSError, http.client.HTTPException):
            break
        if now_count > count:
            last_growth, count = time.monotonic() - since, now_count
        time.sleep(ARRIVALS_POLL_S)
    return last_growth, int(count - first)


@pytest.mark.parametrize("clients", [HEALTH_CHECKING, PICK_FIRST])
@pytest.mark.parametrize("serving_path", ["fast", "aio"])
def test_gateway_sigterm_under_load(
    launcher: Any, whole: Any, scoreboard: Any, serving_path: str, clients: str
) -> None:
    # The clients know both gateways (ipv4:A,B here, a headless Service's DNS name in
    # Kubernetes); the leaving one runs as deployed: on SIGTERM, readiness NOT_SERVING while it
    # keeps serving for its drain delay, then it stops. Health-checking clients (the README's
    # advice) stop picking it during the delay, so no call is left pending in its transport
    # when it stops (gRPC core would end those CANCELLED, grpc/grpc#41785). pick_first clients
    # send to it until the stop's GOAWAY: what saves their calls is the server holding new calls
    # until none is pending (common.stop_gate). Both serving paths: they differ most here.
    leaving = launcher.gateway(
        whole.controller,
        "--shutdown-grace",
        "5",
        "--drain-delay",
        f"{DRAIN_DELAY_S:g}",
        "--serving-path",
        serving_path,
        name=f"gateway-leaving-{serving_path}-{clients}",
    )
    leaving.wait_ready()
    launcher.attach(whole, leaving)
    target = f"ipv4:{leaving.grpc},{whole.gateway.grpc}"
    health_checking = clients == HEALTH_CHECKING
    with _load(
        launcher,
        whole,
        f"gateway-sigterm-{serving_path}-{clients}",
        seconds=8,
        target=target,
        gateway=leaving,
        extra=("--health-check", "readiness") if health_checking else (),
    ) as load:
        load.sleep_until(2.5)
        before = calls_started(leaving)
        load.sleep_until(3.0)
        started = calls_started(leaving)
        taking = started - before  # its share of the load, just before the fault
        fault_at = load.now()
        signalled = time.monotonic()
        leaving.send(signal.SIGTERM)
        last_arrival_s, arrivals = _arrivals_until_stop(leaving, signalled, started)
        code = leaving.wait_exit(10.0)
        exited_s = time.monotonic() - signalled
        result = load.result()
    scenario = f"gateway SIGTERM, {serving_path} path"
    row = result.row(
        scenario if health_checking else f"{scenario}, {clients} clients", fault_at_s=fault_at
    )
    refused = result.rejected.get("SHUTTING_DOWN", 0)
    moved = (
        "none started on it after SIGTERM"
        if last_arrival_s is None
        else f"the last of {arrivals} started on it {last_arrival_s:.2f} s after SIGTERM"
    )
    how = "round_robin on readiness" if health_checking else "pick_first"
    row.notes.append(
        f"clients {how}, drain delay {DRAIN_DELAY_S:g} s: it started {taking:.0f} calls in the "
        f"0.5 s before SIGTERM, {moved}; {refused} refused with SHUTTING_DOWN; exit {code} "
        f"{exited_s:.2f} s after SIGTERM"
    )
    if code != 0:
        row.failures.append(f"the gateway exited with {code}")
    if not taking:
        row.failures.append("the leaving gateway took no calls before SIGTERM: nothing tested")
    if health_checking and last_arrival_s is not None and last_arrival_s >= DRAIN_DELAY_S:
        row.failures.append(
            f"calls still arrived {last_arrival_s:.2f} s after SIGTERM, after the "
            f"{DRAIN_DELAY_S:g} s drain delay: the clients did not move before the stop"
        )
    served_after = sum(w.ok for w in result.windows() if w.start_s >= fault_at + exited_s)
    if not served_after:
        row.failures.append("nothing was served after the gateway exited: the clients did not move")
    _check_served_after_failover(result, row.failures)
    scoreboard.check(row)


def _check_served_after_failover(result: LoadResult, failures: list[str]) -> None:
    """Every request either OK or typed-refused while the gateway drained."""
    others = {k: n for k, n in result.report["outcomes"].items() if k not in ("OK",)}
    others.pop("UNAVAILABLE/SHUTTING_DOWN", None)
    if others:
        failures.append(f"answers other than OK and SHUTTING_DOWN: {others}")


POISON_TIMEOUT_S = 10_000_000_000  # a valid Duration; as a deadline it overflows gRPC's
POISON_CLIENTS = 8


def test_poison_deadline(launcher: Any, whole: Any, scoreboard: Any) -> None:
    # Its own gateway: on a gateway the poison breaks, later scenarios would measure the break.
    gateway = launcher.gateway(whole.controller, name="gateway-poison")
    gateway.wait_ready()
    poisoned = launcher.attach(whole, gateway)
    request = infer_pb2.InferRequest(model=MODEL, input="poison", max_output_tokens=16)
    request.timeout.seconds = POISON_TIMEOUT_S
    with Load(
        gateway.grpc, gateway, launcher.workdir, name="poison", seconds=10, clients=POISON_CLIENTS
    ) as load:
        load.sleep_until(3.0)
        sent_at = load.now()
        # No gRPC deadline: the request's own timeout field is its deadline (a grpcurl user).
        future = poisoned.infer_stub.Infer.future(request, metadata=(("x-api-key", API_KEY),))
        try:
            future.result(timeout=max(0.5, 9.0 - load.now()))
            poison = "OK"
        except grpc.FutureTimeoutError:
            future.cancel()
            poison = "no answer"
        except grpc.RpcError as err:
            poison = outcome_key(err)
        answered_in = load.now() - sent_at
        result = load.result()
    row = result.row("poison deadline (timeout 1e10 s)", fault_at_s=sent_at)
    row.requests += 1
    row.answered += int(is_answer(poison))
    if not is_answer(poison):
        row.lost_detail[f"the poison: {poison}"] = 1
    windows = result.windows()
    before = [w.ok for w in windows if w.start_s + 1.0 <= sent_at]
    after = [w.ok for w in windows if w.start_s >= sent_at + 1.0]
    before_rps = sum(before) / len(before)
    after_rps = sum(after) / len(after)
    row.notes.append(
        f"the poison: {poison} after {answered_in * 1000:.0f} ms; the others' goodput "
        f"{before_rps:.1f}/s before it, {after_rps:.1f}/s from 1 s after it"
    )
    if after_rps < 0.8 * before_rps:
        row.failures.append(
            f"the others' goodput fell from {before_rps:.1f}/s to {after_rps:.1f}/s (>20 %)"
        )
    families = scrape(gateway)
    broken = [
        f"{s.name}{s.labels}"
        for f in families.values()
        for s in f.samples
        if s.name.startswith("halcyon_gateway_cost_model") and not math.isfinite(s.value)
    ]
    if broken:
        row.failures.append(f"cost model not finite: {', '.join(broken)}")
    _check_served(result, row.failures)
    scoreboard.check(row)
