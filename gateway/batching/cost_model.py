"""How long a batch will take on one replica: an online, non-negative affine fit.

What it decides: the predicted device time ``intercept + slope × tokens`` of a batch, and how
far above that prediction a real batch can plausibly land. Every feasibility decision the
batcher makes — admit or reject, keep waiting or flush, keep or shed — is only as good as
this number.

How:

* **Recursive least squares with exponential forgetting**, kept in information form (the 2×2
  matrix ``Σ λ^age · x·xᵀ`` and vector ``Σ λ^age · x·y`` with ``x = (1, tokens)``). Forgetting
  (``λ = 0.98`` ≈ the last 50 batches) lets the fit follow a driver upgrade or a noisy
  neighbour instead of averaging over hours.
* **A prior that never fully fades**, as two pseudo-batches (0 tokens and ``prior_tokens``
  tokens, priced at the prior coefficients) re-added with weight ``1 − λ`` at every update.
  Their share settles at ``prior_weight`` pseudo-batches against ~50 real ones, so data
  dominates wherever data exists — but when every batch has nearly the same size the data
  pins only the prediction *at* that size, and the prior keeps the other direction sane
  instead of the information matrix going singular (the seed's model simply stopped learning
  there; plain RLS with forgetting winds its covariance up and extrapolates wildly).
* **Constrained non-negative**: the solve is a two-variable non-negative least squares, not
  an unconstrained solve with each coefficient clamped afterwards — clamping a negative slope
  to zero while keeping the intercept it inflated is how the seed once predicted 6.9 s for
  every batch.
* **One model per replica**: a 0.6× straggler's batches must not teach the fast replica that
  it is slow. The batcher owns one instance per replica.
* **Spread**: the root-mean-square relative residual (measured against the prediction made
  *before* each update) says how far real batches stray; ``upper(tokens)`` adds
  ``spread_z`` of them on top of the prediction for decisions that must not be optimistic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CostSnapshot:
    """The fitted coefficients, for metrics and debugging."""

    intercept_s: float
    slope_s_per_token: float
    relative_spread: float
    observations: int


class OnlineCostModel:
    """Non-negative recursive least squares for ``seconds ≈ intercept + slope × tokens``."""

    __slots__ = (
        "_a00",
        "_a01",
        "_a11",
        "_b0",
        "_b1",
        "_forgetting",
        "_intercept",
        "_mean_sq_rel",
        "_observations",
        "_p00",
        "_p01",
        "_p11",
        "_q0",
        "_q1",
        "_slope",
        "_spread_z",
        "_upper_factor",
    )

    def __init__(
        self,
        prior_intercept_s: float = 0.010,
        prior_slope_s_per_token: float = 0.00005,
        *,
        forgetting: float = 0.98,
        prior_weight: float = 1.0,
        prior_tokens: float = 1024.0,
        initial_spread: float = 0.10,
        spread_z: float = 2.0,
    ) -> None:
        if prior_intercept_s < 0 or prior_slope_s_per_token < 0:
            raise ValueError("cost model priors must be non-negative")
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting}")
        if prior_weight <= 0 or prior_tokens <= 0:
            raise ValueError("prior weight and prior tokens must be positive")
        self._forgetting = forgetting
        self._spread_z = spread_z
        # Prior pseudo-batches at 0 and prior_tokens tokens, half the weight each.
        half = 0.5 * prior_weight
        y0 = prior_intercept_s
        y1 = prior_intercept_s + prior_slope_s_per_token * prior_tokens
        self._p00 = 2.0 * half
        self._p01 = half * prior_tokens
        self._p11 = half * prior_tokens * prior_tokens
        self._q0 = half * (y0 + y1)
        self._q1 = half * prior_tokens * y1
        self._a00, self._a01, self._a11 = self._p00, self._p01, self._p11
        self._b0, self._b1 = self._q0, self._q1
        self._intercept = prior_intercept_s
        self._slope = prior_slope_s_per_token
        self._mean_sq_rel = initial_spread * initial_spread
        self._upper_factor = 1.0 + spread_z * initial_spread
        self._observations = 0

    # -- learning ------------------------------------------------------------------------

    def observe(self, tokens: float, seconds: float) -> None:
        """Learns from one executed batch: ``tokens`` of work took ``seconds`` on the device."""
        if tokens < 0 or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"not a batch measurement: tokens={tokens}, seconds={seconds}")
        predicted = self._intercept + self._slope * tokens
        if predicted > 0.0:
            rel = seconds / predicted - 1.0
            # Weighted like the fit, so the spread follows the same recent window.
            g = self._forgetting
            self._mean_sq_rel = g * self._mean_sq_rel + (1.0 - g) * min(rel * rel, 1.0)
            self._upper_factor = 1.0 + self._spread_z * math.sqrt(self._mean_sq_rel)
        g = self._forgetting
        w = 1.0 - g
        self._a00 = g * self._a00 + 1.0 + w * self._p00
        self._a01 = g * self._a01 + tokens + w * self._p01
        self._a11 = g * self._a11 + tokens * tokens + w * self._p11
        self._b0 = g * self._b0 + seconds + w * self._q0
        self._b1 = g * self._b1 + tokens * seconds + w * self._q1
        self._observations += 1
        self._solve()

    def _solve(self) -> None:
        """Two-variable non-negative least squares on the information form."""
        a00, a01, a11, b0, b1 = self._a00, self._a01, self._a11, self._b0, self._b1
        det = a00 * a11 - a01 * a01
        if det > 1e-12 * a00 * a11:
            intercept = (a11 * b0 - a01 * b1) / det
            slope = (a00 * b1 - a01 * b0) / det
            if intercept >= 0.0 and slope >= 0.0:
                self._intercept, self._slope = intercept, slope
                return
        # The unconstrained optimum lies outside the feasible quadrant, so the constrained
        # one is on a boundary: hold one coefficient at zero and re-solve for the other,
        # then keep whichever boundary point fits better (objective θᵀAθ − 2bᵀθ).
        best = (0.0, 0.0, 0.0)
        slope_only = max(0.0, b1 / a11) if a11 > 0 else 0.0
        cost = a11 * slope_only * slope_only - 2.0 * b1 * slope_only
        if cost < best[0]:
            best = (cost, 0.0, slope_only)
        intercept_only = max(0.0, b0 / a00) if a00 > 0 else 0.0
        cost = a00 * intercept_only * intercept_only - 2.0 * b0 * intercept_only
        if cost < best[0]:
            best = (cost, intercept_only, 0.0)
        self._intercept, self._slope = best[1], best[2]

    # -- predictions ---------------------------------------------------------------------

    @property
    def intercept(self) -> float:
        """Fixed seconds per batch (kernel launch, weight paging, dispatch)."""
        return self._intercept

    @property
    def slope(self) -> float:
        """Marginal seconds per token."""
        return self._slope

    @property
    def upper_factor(self) -> float:
        """``upper(t) / predict(t)``: 1 + ``spread_z`` × the RMS relative residual."""
        return self._upper_factor

    def coefficients(self) -> tuple[float, float, float]:
        """``(intercept, slope, upper_factor)`` in one call, for paths that need all three."""
        return self._intercept, self._slope, self._upper_factor

    @property
    def relative_spread(self) -> float:
        """Root-mean-square relative error of recent predictions."""
        return math.sqrt(self._mean_sq_rel)

    @property
    def observations(self) -> int:
        return self._observations

    def predict(self, tokens: float) -> float:
        """Expected device seconds for a batch of ``tokens``."""
        return self._intercept + self._slope * tokens

    def upper(self, tokens: float) -> float:
        """A prediction a real batch should rarely exceed (for must-not-be-late decisions)."""
        return (self._intercept + self._slope * tokens) * self._upper_factor

    def snapshot(self) -> CostSnapshot:
        return CostSnapshot(
            intercept_s=self._intercept,
            slope_s_per_token=self._slope,
            relative_spread=self.relative_spread,
            observations=self._observations,
        )
