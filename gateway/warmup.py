"""A replica's measured warm-up batches as a first cost model and a routing prior.

What it decides: what a gateway believes about a replica's batch cost *before* the replica
has served it anything. A worker measures a few batches on its runtime before it registers
(``ReplicaDescriptor.warmup``); when the replica first joins a dispatcher, its cost model is
built from them, so the first real batch already has a prediction of the device's real cost
(and an attempt timeout derived from it — a device whose batches take 30 s is given well over
30 s, not a constant), and the router's idle prior is the measured batch time instead of a
nominal one scaled by the advertised speed.

How: the samples' non-negative least-squares line ``seconds ≈ intercept + slope × tokens``
becomes the cost model's prior, and the samples are then observed as batches (with their
longest output budgets, as the batcher observes real ones, so a decode-step cost the samples
show is learned like any other). The prior
matters: the default one (10 ms + 0.05 ms/token, pseudo-batches at 0 and 1,024 tokens) would
otherwise pull a two-sample fit of a 5 s device a third of the way towards 10 ms; a prior
that agrees with the measurement leaves it where it was measured, and real batches refine it
as for any replica. Samples of a single size pin only the cost at that size: the line is then
flat (all intercept), which real batches of other sizes correct.

Pure: samples in, a model and a number out; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from common.cost_samples import CostSampleValue
from gateway.batching import OnlineCostModel

__all__ = ["fit_line", "prior_latency_s", "seeded_cost_model"]

# The shortest idle prior a measured replica gets: a call's own round trip costs about this.
_MIN_PRIOR_S = 1e-4


def _usable(samples: Sequence[CostSampleValue]) -> list[CostSampleValue]:
    return [
        s for s in samples if s.batch_tokens >= 0 and math.isfinite(s.seconds) and s.seconds >= 0.0
    ]


def fit_line(samples: Sequence[CostSampleValue]) -> tuple[float, float] | None:
    """``(intercept_s, slope_s_per_token)``, both non-negative, fitted to the samples by
    least squares; None without a usable sample."""
    usable = _usable(samples)
    if not usable:
        return None
    n = len(usable)
    xs = [float(s.batch_tokens) for s in usable]
    ys = [s.seconds for s in usable]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0.0:  # one size: only the cost at that size is known
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    if slope < 0.0:  # larger batches measured faster (noise): a flat line through the mean
        return my, 0.0
    if intercept < 0.0:  # a line through the origin
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return intercept, slope


def seeded_cost_model(samples: Sequence[CostSampleValue]) -> OnlineCostModel | None:
    """A cost model that has learned the warm-up (None without a usable sample: the batcher's
    default prior then stands, and the replica has no prediction until it answers)."""
    line = fit_line(samples)
    if line is None:
        return None
    model = OnlineCostModel(prior_intercept_s=line[0], prior_slope_s_per_token=line[1])
    for s in _usable(samples):
        # As the batcher observes a real batch: work tokens, its longest output budget.
        model.observe(tokens=s.batch_tokens, seconds=s.seconds, longest=s.longest_output_tokens)
    return model


def prior_latency_s(samples: Sequence[CostSampleValue]) -> float | None:
    """The router's idle prior for the replica: the mean measured batch time (None without
    a usable sample)."""
    usable = _usable(samples)
    if not usable:
        return None
    return max(_MIN_PRIOR_S, sum(s.seconds for s in usable) / len(usable))
