"""``halcyon loadtest``'s report: the figures of one run, as JSON, as text, and as a result.

:func:`summarize` turns a :class:`~halcyon.tools.loadtest_tally.Tally` (plus the gateway's and
workers' counters read from /metrics, :func:`read_gateway_counters`, :func:`read_workers_cpu`)
into the ``--json`` object, :func:`render` prints it for a person, and
:class:`LoadResult` (:meth:`LoadResult.from_report`) gives a library caller every figure by
name, per SLO class too (:class:`ClassResult`). Apart from the driver so the report can be
built and checked from a tally made by hand.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from halcyon.tools.loadtest_mix import SloClass
from halcyon.tools.loadtest_tally import ClassTally, Tally, _quantile


@dataclass(frozen=True)
class GatewayCounters:
    """What the gateway's /metrics says about its own work, read before and after a run."""

    cpu_seconds: float
    batches: float | None = None  # halcyon_gateway_batch_size_count
    batched_requests: float | None = None  # halcyon_gateway_batch_size_sum

    def minus(self, before: GatewayCounters) -> GatewayCounters:
        def delta(now: float | None, then: float | None) -> float | None:
            return None if now is None or then is None else now - then

        return GatewayCounters(
            self.cpu_seconds - before.cpu_seconds,
            delta(self.batches, before.batches),
            delta(self.batched_requests, before.batched_requests),
        )


def read_gateway_counters(metrics_address: str) -> GatewayCounters | None:
    """The gateway's CPU seconds and dispatched batches, or None if /metrics cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    url = metrics_address if "://" in metrics_address else f"http://{metrics_address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    cpu: float | None = None
    batches: float | None = None
    batched: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "process_cpu_seconds_total":
                cpu = float(sample.value)
            elif sample.name == "halcyon_gateway_batch_size_count":
                batches = (batches or 0.0) + float(sample.value)
            elif sample.name == "halcyon_gateway_batch_size_sum":
                batched = (batched or 0.0) + float(sample.value)
    return None if cpu is None else GatewayCounters(cpu, batches, batched)


def read_process_cpu(metrics_address: str) -> float | None:
    """A process's ``process_cpu_seconds_total`` from its /metrics, or None if unreadable."""
    counters = read_gateway_counters(metrics_address)
    return None if counters is None else counters.cpu_seconds


def read_workers_cpu(addresses: Sequence[str]) -> dict[str, float]:
    """``process_cpu_seconds_total`` of every worker whose /metrics could be read."""
    readings = {}
    for address in addresses:
        cpu = read_process_cpu(address)
        if cpu is not None:
            readings[address] = cpu
    return readings


def _timeline(tally: Tally) -> list[dict[str, Any]]:
    """Per second since the start: ok, on time, lost and rejections by reason (attempts)."""
    rows = []
    for second, bucket in enumerate(tally.timeline):
        rejected = {
            label.split("/", 1)[1]: n
            for label, n in sorted(bucket.items())
            if label.startswith("rejected/")
        }
        rows.append(
            {
                "t": second,
                "ok": bucket.get("ok", 0),
                "on_time": bucket.get("on_time", 0),
                "rejected": rejected,
                "lost": bucket.get("lost", 0),
            }
        )
    return rows


def _class_report(cls: SloClass, t: ClassTally) -> dict[str, Any]:
    lat = sorted(t.latencies_ms)
    return {
        "name": cls.name,
        "share": cls.share,
        "deadline_ms": cls.deadline_ms,
        "offered": t.offered,
        "succeeded": t.ok,
        "on_time": t.on_time,
        "on_time_share": t.on_time / t.offered if t.offered else 0.0,
        "refused": t.refused,
        "admitted_late": t.late,
        "lost": t.lost,
        "client_dropped": t.client_dropped,
        "p50_ms": _quantile(lat, 0.50),
        "p95_ms": _quantile(lat, 0.95),
        "p99_ms": _quantile(lat, 0.99),
    }


def summarize(
    tally: Tally,
    elapsed: float,
    gateway: GatewayCounters | None,
    *,
    classes: Sequence[SloClass] = (),
    window_s: float | None = None,
    workers_cpu_s: float | None = None,
) -> dict[str, Any]:
    """The report (what ``--json`` prints). ``classes`` names ``tally.classes``; ``window_s``
    is the arrival window (``--seconds``) goodput is judged over; ``workers_cpu_s`` the
    workers' CPU seconds over the run (``--worker-metrics``)."""
    lat = sorted(tally.latencies_ms)
    added = sorted(tally.added_ms)
    requests = tally.requests
    window = window_s if window_s else elapsed
    admitted = requests - tally.refused
    # Attempts the gateway answered (successes plus every rejection, retries included): what
    # its CPU was spent on.
    served_attempts = tally.ok + sum(tally.rejected.values())

    def per_s(n: int) -> float:
        return n / elapsed if elapsed else 0.0

    def share(n: int) -> float:
        return n / requests if requests else 0.0

    return {
        "requests": requests,
        "answered": tally.answered,
        "ok": tally.ok,
        "on_time": tally.on_time,
        "lost": tally.lost,
        "attempts": tally.sent,
        "retries": tally.retries,
        "unfinished": tally.unfinished,
        "success_rate": share(tally.ok),
        "on_time_rate": share(tally.on_time),
        "lost_rate": share(tally.lost),
        "answered_rps": per_s(tally.answered),
        "success_rps": per_s(tally.ok),
        "on_time_rps": per_s(tally.on_time),
        # Kept for older readers: throughput counts successful answers only (a rejection is
        # not throughput), goodput the on-time ones.
        "throughput_rps": per_s(tally.ok),
        "goodput_rps": per_s(tally.on_time),
        # On-time successes over the arrival window: the benchmark's goodput.
        "goodput_window_rps": tally.on_time / window if window else 0.0,
        "window_s": window,
        "offered": sum(c.offered for c in tally.classes) or requests + tally.client_dropped,
        "admitted": admitted,
        "admitted_late": tally.admitted_late,
        "admitted_late_share": tally.admitted_late / admitted if admitted else 0.0,
        "classes": [_class_report(c, t) for c, t in zip(classes, tally.classes, strict=False)],
        "p50_ms": _quantile(lat, 0.50),
        "p95_ms": _quantile(lat, 0.95),
        "p99_ms": _quantile(lat, 0.99),
        "max_ms": lat[-1] if lat else math.nan,
        "added_p50_ms": _quantile(added, 0.50),
        "added_p99_ms": _quantile(added, 0.99),
        "mean_batch_size": sum(tally.batch_sizes) / len(tally.batch_sizes)
        if tally.batch_sizes
        else 0.0,
        "hedge_rate": tally.hedged / tally.ok if tally.ok else 0.0,
        "outcomes": dict(sorted(tally.outcomes.items())),
        "rejected": dict(sorted(tally.rejected.items())),
        "versions": dict(sorted(tally.versions.items())),
        "client_dropped": tally.client_dropped,
        "elapsed_s": elapsed,
        "gateway_cpu_ms_per_request": (gateway.cpu_seconds * 1000.0 / served_attempts)
        if gateway is not None and served_attempts
        else None,
        "gateway_cpu_s": gateway.cpu_seconds if gateway is not None else None,
        # The workers' CPU (summed) per attempt the gateway answered, as for the gateway's.
        "worker_cpu_ms_per_request": (workers_cpu_s * 1000.0 / served_attempts)
        if workers_cpu_s is not None and served_attempts
        else None,
        "worker_cpu_s": workers_cpu_s,
        # The gateway's own count over all its traffic in the run (this client's, normally):
        # batches dispatched and the plain mean of their sizes, where ``mean_batch_size`` above
        # is the size of the batch each answer came in (larger batches count more often).
        "gateway_batches": int(gateway.batches)
        if gateway is not None and gateway.batches is not None
        else None,
        "gateway_requests_per_batch": gateway.batched_requests / gateway.batches
        if gateway is not None and gateway.batches and gateway.batched_requests is not None
        else None,
        "timeline": _timeline(tally),
        # Only with several --target gateways: one keeps today's report.
        **({"targets": _targets(tally)} if tally.by_target else {}),
    }


def _targets(tally: Tally) -> dict[str, dict[str, int]]:
    """Requests that ended, and successes, per --target gateway."""
    return {t: {"requests": n, "ok": tally.ok_by_target[t]} for t, n in tally.by_target.items()}


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def render(report: dict[str, Any]) -> str:
    requests = report["requests"]
    lines = [
        f"  requests        {requests:<10d}  answered {report['answered']}, "
        f"lost {report['lost']}"
        + (
            f"   ({report['attempts']} attempts, {report['retries']} retries; "
            f"{report['unfinished']} cut off by the end of the run)"
            if report["retries"] or report["unfinished"]
            else ""
        ),
        f"  answered        {report['answered_rps']:.1f} req/s   (any Halcyon answer, "
        "rejections included)",
        f"  successful      {report['success_rps']:.1f} req/s   "
        f"success rate {100.0 * report['success_rate']:.2f}%",
        f"  on time         {report['on_time_rps']:.1f} req/s   "
        f"{100.0 * report['on_time_rate']:.2f}% of requests succeeded within their deadline",
        f"  p50/p95/p99     {report['p50_ms']:.1f} / {report['p95_ms']:.1f} / "
        f"{report['p99_ms']:.1f} ms   (max {report['max_ms']:.1f} ms; successful requests, "
        "from the first attempt)",
        f"  added latency   p50 {report['added_p50_ms']:.2f} / p99 {report['added_p99_ms']:.2f} ms"
        "   (end to end minus the worker's device time)",
        f"  mean batch size {report['mean_batch_size']:.2f}   hedge rate "
        f"{100.0 * report['hedge_rate']:.2f}%",
        "  outcomes        " + _counts(report["outcomes"]) + "   (final answer per request)",
    ]
    if report["rejected"]:
        lines.append(
            "  rejections      " + _counts(report["rejected"]) + "   (every rejected attempt)"
        )
    lines.append("  versions        " + _counts(report["versions"]))
    if report["client_dropped"]:
        lines.append(
            f"  client dropped  {report['client_dropped']} (open loop over --max-inflight)"
        )
    for c in report.get("classes") or []:
        lines.append(
            f"  class {c['name']:<9s} {c['offered']} offered, {c['succeeded']} succeeded, "
            f"{c['on_time']} on time ({100.0 * c['on_time_share']:.1f}%) within "
            f"{c['deadline_ms']:g} ms   p50/p99 {c['p50_ms']:.1f} / {c['p99_ms']:.1f} ms"
        )
    if "goodput_window_rps" in report:
        lines.append(
            f"  goodput         {report['goodput_window_rps']:.1f} on-time req/s over the "
            f"{report['window_s']:g} s arrival window"
        )
        lines.append(
            f"  admitted, late  {report['admitted_late']} of {report['admitted']} admitted "
            f"({100.0 * report['admitted_late_share']:.2f}%) answered after their deadline or "
            "with DEADLINE_EXCEEDED"
        )
    for target, counts in (report.get("targets") or {}).items():
        lines.append(
            f"  target          {target}: {counts['requests']} requests, {counts['ok']} successful"
        )
    if report["gateway_cpu_ms_per_request"] is not None:
        lines.append(f"  gateway CPU     {report['gateway_cpu_ms_per_request']:.3f} ms per request")
    if report.get("worker_cpu_ms_per_request") is not None:
        lines.append(
            f"  worker CPU      {report['worker_cpu_ms_per_request']:.3f} ms per request "
            "(all --worker-metrics workers)"
        )
    if report.get("gateway_requests_per_batch") is not None:
        lines.append(
            f"  gateway batches {report['gateway_batches']} dispatched, "
            f"{report['gateway_requests_per_batch']:.2f} requests per batch "
            "(mean batch size above is per answer)"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class ClassResult:
    """One SLO class's figures (see :func:`summarize`'s ``classes``)."""

    name: str
    share: float
    deadline_ms: float
    offered: int
    succeeded: int
    on_time: int
    on_time_share: float  # of offered
    refused: int
    admitted_late: int
    lost: int
    client_dropped: int
    p50_ms: float
    p95_ms: float
    p99_ms: float


@dataclass(frozen=True)
class LoadResult:
    """Every figure of one load test; ``report`` is the ``--json`` object (and more keys)."""

    mode: str
    report: dict[str, Any]
    offered: int  # requests begun, plus arrivals the open-loop client dropped
    requests: int  # requests that ended
    succeeded: int
    on_time: int
    elapsed_s: float  # wall time, including answers still awaited after the window
    window_s: float  # the arrival window (--seconds)
    goodput_rps: float  # on-time successes / window_s
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_batch_size: float  # per successful answer (InferResponse.batch.size)
    gateway_requests_per_batch: float | None  # the gateway's histogram, per dispatch
    gateway_cpu_ms_per_request: float | None
    worker_cpu_ms_per_request: float | None
    admitted: int
    admitted_late: int
    admitted_late_share: float
    classes: tuple[ClassResult, ...]
    # Every successful request's latency (ms, from its first attempt), sorted: what the
    # quantiles above and the --slo latency objectives are taken from.
    latencies_ms: tuple[float, ...] = ()

    @classmethod
    def from_report(
        cls, mode: str, report: dict[str, Any], latencies_ms: Sequence[float] = ()
    ) -> LoadResult:
        return cls(
            mode=mode,
            report=report,
            offered=report["offered"],
            requests=report["requests"],
            succeeded=report["ok"],
            on_time=report["on_time"],
            elapsed_s=report["elapsed_s"],
            window_s=report["window_s"],
            goodput_rps=report["goodput_window_rps"],
            p50_ms=report["p50_ms"],
            p95_ms=report["p95_ms"],
            p99_ms=report["p99_ms"],
            mean_batch_size=report["mean_batch_size"],
            gateway_requests_per_batch=report["gateway_requests_per_batch"],
            gateway_cpu_ms_per_request=report["gateway_cpu_ms_per_request"],
            worker_cpu_ms_per_request=report["worker_cpu_ms_per_request"],
            admitted=report["admitted"],
            admitted_late=report["admitted_late"],
            admitted_late_share=report["admitted_late_share"],
            classes=tuple(ClassResult(**c) for c in report["classes"]),
            latencies_ms=tuple(sorted(latencies_ms)),
        )
