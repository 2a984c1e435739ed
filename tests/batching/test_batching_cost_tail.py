"""The cost model's safety margin follows the residuals the device really produced: on a
heavy-tailed device (most batches on time, a few much slower) it widens to their empirical
upper quantile; on bounded jitter (the simulated device) z x RMS already covers it."""

from __future__ import annotations

import math
import random

from gateway.batching import OnlineCostModel


def _feed(model: OnlineCostModel, seconds_of: list[float], tokens: int = 1000) -> None:
    for seconds in seconds_of:
        model.observe(tokens, seconds)


def test_rare_slow_batches_widen_the_margin_to_their_quantile() -> None:
    rng = random.Random(7)
    # 95 % of batches at 100 ms +/- 2 %, 5 % at 1.5x: RMS is ~11 %, z x RMS ~22 %, but one
    # batch in twenty lands 50 % late.
    seconds = [
        0.1 * (1.5 if rng.random() < 0.05 else 1 + rng.uniform(-0.02, 0.02)) for _ in range(400)
    ]
    model = OnlineCostModel(0.1, 0.0)
    _feed(model, seconds)
    rms_margin = 2.0 * model.relative_spread
    assert model.upper_factor - 1.0 > rms_margin + 0.1
    late = sum(1 for s in seconds[-64:] if s > model.upper(1000))
    assert late <= 2  # the 98th percentile of the recent window is covered


def test_bounded_jitter_keeps_the_z_rms_margin() -> None:
    rng = random.Random(3)
    model = OnlineCostModel(0.1, 0.0)
    _feed(model, [0.1 * (1 + rng.uniform(-0.08, 0.08)) for _ in range(400)])
    assert math.isclose(model.upper_factor, 1.0 + 2.0 * model.relative_spread)


def test_the_tail_needs_a_few_batches_before_it_counts() -> None:
    model = OnlineCostModel(0.1, 0.0)
    _feed(model, [0.1] * 10 + [0.5])  # one outlier among the first 11: the RMS rule alone
    assert math.isclose(model.upper_factor, 1.0 + 2.0 * model.relative_spread)
