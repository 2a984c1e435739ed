"""How long a batch will take on one replica: an online, non-negative three-term fit.

What it decides: the predicted device time ``intercept + slope × tokens + step × longest`` of
a batch, and how far above that prediction a real batch can plausibly land. ``tokens`` is the
batch's work (Σ input + output budget of its items) and ``longest`` its largest output budget:
an autoregressive decoder runs one decode step per output position until the batch's longest
output is done, and each step pays a fixed overhead (kernel launches, the step's dispatch)
whatever the batch size — ``step`` prices that. A device with no decode loop (the simulated
one, or a caller that does not know output budgets: ``longest = 0``) is the two-term model
``intercept + slope × tokens``, with exactly the same arithmetic. Every feasibility decision
the batcher makes — admit or reject, keep waiting or flush, keep or shed — is only as good as
this number.

How:

* **Recursive least squares with exponential forgetting**, kept in information form (the 3×3
  matrix ``Σ λ^age · x·xᵀ`` and vector ``Σ λ^age · x·y`` with ``x = (1, tokens, longest)``).
  Forgetting (``λ = 0.98`` ≈ the last 50 batches) lets the fit follow a driver upgrade or a
  noisy neighbour instead of averaging over hours.
* **A prior that never fully fades**, as pseudo-batches re-added with weight ``1 − λ`` at
  every update: two batches (0 and ``prior_tokens`` tokens, priced at the prior coefficients)
  and a weak *contrast* for the step — "a decode loop ``prior_longest`` steps longer costs
  ``prior_step × prior_longest`` more" (``x = (0, 0, prior_longest)``; the step prior is 0 by
  default). Their share settles at ``prior_weight`` pseudo-batches against ~50 real ones, so
  data dominates wherever data exists — but when every batch has nearly the same size (or
  ``longest`` moves in lockstep with ``tokens``) the data pins only the prediction *along*
  that line, and the prior keeps the other directions sane instead of the information matrix
  going singular (the seed's model simply stopped learning there; plain RLS with forgetting
  winds its covariance up and extrapolates wildly).
* **The prior sits where the data is.** The two prior batches are placed at the recent mean
  ``longest`` of the real batches, not at ``longest = 0``, and priced at the prior intercept
  and slope plus the *fitted* step's cost for that decode length. Real decode batches never
  have ``longest = 0``: a prior placed there is a far-away point with leverage over exactly the
  split the data pins worst (intercept against step), so a wrong prior intercept would leak
  into both; and a prior priced without the decode steps at the data's own decode length would
  claim its typical batch is cheaper than it is (a systematic under-prediction of ~1/50 of the
  decode cost). So the prior speaks about intercept and slope where the data is, and about the
  step only through the weak contrast. With no decode data the mean is 0 and nothing touches
  the step's row of the information form: the model fits exactly what the two-term model
  fits, with the same floating-point results.
* **Constrained non-negative**: the solve is a true three-variable non-negative least squares
  on the information form, not an unconstrained solve with each coefficient clamped afterwards
  — clamping a negative slope to zero while keeping the intercept it inflated is how the seed
  once predicted 6.9 s for every batch (ADR 0001). It is an exact active-set solve in closed
  form: the unconstrained optimum when it is non-negative (tried first once decode data
  exists: the common case); else the face ``step = 0`` (the two-variable problem, itself
  solved exactly), which is optimal whenever the objective does not fall as ``step`` leaves 0
  there (the KKT condition — always so without decode data); else the optimum has
  ``step > 0`` on one of the three remaining faces that contain it, each solved in closed form
  and compared by objective. A few dozen flops, no iteration: ``observe`` runs once per batch
  (~1.6 µs without decode data, ~2.6 µs with it, against ~1.2 µs for the two-term model).
* **One model per replica**: a 0.6× straggler's batches must not teach the fast replica that
  it is slow. The batcher owns one instance per replica.
* **Spread**: the root-mean-square relative residual (measured against the prediction made
  *before* each update) says how far real batches stray; ``upper(tokens, longest)`` adds
  ``spread_z`` of them on top of the prediction for decisions that must not be optimistic.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# The step's contrast pseudo-batch carries this share of ``prior_weight``: enough to keep the
# information form regular when ``longest`` never varies on its own, little enough that a
# real step cost is not shrunk toward the prior.
_CONTRAST_SHARE = 0.01
# A solve whose determinant is below this share of the product of its diagonal (the
# determinant of the Jacobi-scaled matrix) is treated as singular.
_SINGULAR = 1e-12


# Recent relative residuals kept for the empirical tail, and how many before it counts.
_TAIL_WINDOW = 64
_TAIL_MIN = 16


@dataclass(frozen=True, slots=True)
class CostSnapshot:
    """The fitted coefficients, for metrics and debugging."""

    intercept_s: float
    slope_s_per_token: float
    relative_spread: float
    observations: int
    # Seconds per decode step of the batch's longest output (0 for a device without one).
    step_s: float = 0.0


class OnlineCostModel:
    """Non-negative recursive least squares for
    ``seconds ≈ intercept + slope × tokens + step × longest``."""

    __slots__ = (
        "_a00",
        "_a01",
        "_a02",
        "_a11",
        "_a12",
        "_a22",
        "_b0",
        "_b1",
        "_b2",
        "_forgetting",
        "_intercept",
        "_longest_mean",
        "_mean_sq_rel",
        "_observations",
        "_p00",
        "_p01",
        "_p11",
        "_p22",
        "_q0",
        "_q1",
        "_q2",
        "_seen",
        "_slope",
        "_spread_z",
        "_step",
        "_tail",
        "_tail_quantile",
        "_upper_factor",
    )

    def __init__(
        self,
        prior_intercept_s: float = 0.010,
        prior_slope_s_per_token: float = 0.00005,
        *,
        prior_step_s: float = 0.0,
        forgetting: float = 0.98,
        prior_weight: float = 1.0,
        prior_tokens: float = 1024.0,
        prior_longest: float = 256.0,
        initial_spread: float = 0.10,
        spread_z: float = 2.0,
        tail_quantile: float = 0.98,
    ) -> None:
        if prior_intercept_s < 0 or prior_slope_s_per_token < 0 or prior_step_s < 0:
            raise ValueError("cost model priors must be non-negative")
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting}")
        if prior_weight <= 0 or prior_tokens <= 0 or prior_longest <= 0:
            raise ValueError("prior weight, prior tokens and prior longest must be positive")
        if not 0.0 < tail_quantile < 1.0:
            raise ValueError(f"tail_quantile must be in (0, 1), got {tail_quantile}")
        self._forgetting = forgetting
        self._spread_z = spread_z
        self._tail_quantile = tail_quantile
        # The most recent relative residuals, for the empirical tail (see ``upper_factor``).
        self._tail: deque[float] = deque(maxlen=_TAIL_WINDOW)
        # Prior pseudo-batches at 0 and prior_tokens tokens, half the weight each.
        half = 0.5 * prior_weight
        y0 = prior_intercept_s
        y1 = prior_intercept_s + prior_slope_s_per_token * prior_tokens
        self._p00 = 2.0 * half
        self._p01 = half * prior_tokens
        self._p11 = half * prior_tokens * prior_tokens
        self._q0 = half * (y0 + y1)
        self._q1 = half * prior_tokens * y1
        # The step's contrast pseudo-batch, x = (0, 0, prior_longest).
        contrast = _CONTRAST_SHARE * prior_weight
        self._p22 = contrast * prior_longest * prior_longest
        self._q2 = contrast * prior_longest * (prior_step_s * prior_longest)
        # Where the two prior batches sit along ``longest``: the recent (forgetting-weighted)
        # mean of the real batches' ``longest``, and the weight behind that mean.
        self._longest_mean = 0.0
        self._seen = 0.0
        self._a00, self._a01, self._a11 = self._p00, self._p01, self._p11
        self._a02 = self._a12 = 0.0
        self._a22 = self._p22
        self._b0, self._b1, self._b2 = self._q0, self._q1, self._q2
        self._intercept = prior_intercept_s
        self._slope = prior_slope_s_per_token
        self._step = prior_step_s
        self._mean_sq_rel = initial_spread * initial_spread
        self._upper_factor = 1.0 + spread_z * initial_spread
        self._observations = 0

    # -- learning ------------------------------------------------------------------------

    def observe(self, tokens: float, seconds: float, longest: float = 0) -> None:
        """Learns from one executed batch: ``tokens`` of work whose longest output budget was
        ``longest`` (0: unknown, or no decode loop) took ``seconds`` on the device."""
        if tokens < 0 or longest < 0 or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                f"not a batch measurement: tokens={tokens}, longest={longest}, seconds={seconds}"
            )
        predicted = (self._intercept + self._step * longest) + self._slope * tokens
        if predicted > 0.0:
            rel = seconds / predicted - 1.0
            # Weighted like the fit, so the spread follows the same recent window.
            g = self._forgetting
            self._mean_sq_rel = g * self._mean_sq_rel + (1.0 - g) * min(rel * rel, 1.0)
            tail = self._tail
            tail.append(min(rel, 1.0))
            margin = self._spread_z * math.sqrt(self._mean_sq_rel)
            if len(tail) >= _TAIL_MIN:
                # The empirical upper quantile of recent residuals, when it reaches beyond
                # spread_z RMS: a real device's residuals are heavy-tailed (a noisy neighbour,
                # a GC pause), and z x RMS covers them only for light-tailed noise such as
                # the simulated device's bounded jitter (where this never binds).
                ranked = sorted(tail)
                q = ranked[min(len(ranked) - 1, int(self._tail_quantile * len(ranked)))]
                margin = max(margin, q)
            self._upper_factor = 1.0 + margin
        g = self._forgetting
        w = 1.0 - g
        self._seen = seen = g * self._seen + 1.0
        lm = self._longest_mean
        if longest or lm:
            # The prior batches move to the data's decode length, priced with the fitted step.
            self._longest_mean = lm = lm + (longest - lm) / seen
            shift = self._step * lm
            q0 = self._q0 + self._p00 * shift
            q1 = self._q1 + self._p01 * shift
            # The step's row: the prior batches at ``longest = lm``, plus the contrast.
            self._a02 = g * self._a02 + longest + w * (self._p00 * lm)
            self._a12 = g * self._a12 + tokens * longest + w * (self._p01 * lm)
            self._a22 = g * self._a22 + longest * longest + w * (self._p22 + self._p00 * lm * lm)
            self._b2 = g * self._b2 + longest * seconds + w * (self._q2 + q0 * lm)
        else:
            # No decode data yet: the step's row holds the contrast alone (a02 = a12 = 0,
            # a22 = p22, b2 = q2 — its fixed point under forgetting), and the sums below are
            # exactly the two-term model's.
            q0, q1 = self._q0, self._q1
        self._a00 = g * self._a00 + 1.0 + w * self._p00
        self._a01 = g * self._a01 + tokens + w * self._p01
        self._a11 = g * self._a11 + tokens * tokens + w * self._p11
        self._b0 = g * self._b0 + seconds + w * q0
        self._b1 = g * self._b1 + tokens * seconds + w * q1
        self._observations += 1
        self._solve()

    def _solve(self) -> None:
        """Three-variable non-negative least squares on the information form (exact)."""
        a00, a01, a11, b0, b1 = self._a00, self._a01, self._a11, self._b0, self._b1
        a02, a12, a22, b2 = self._a02, self._a12, self._a22, self._b2
        decoding = self._longest_mean > 0.0
        if decoding:
            # With decode data the unconstrained optimum is usually feasible: try it first.
            full = _full3(a00, a01, a02, a11, a12, a22, b0, b1, b2)
            if full is not None:
                self._intercept, self._slope, self._step = full
                return
        intercept, slope = _nnls2(a00, a01, a11, b0, b1)
        # KKT on the face step = 0: if the objective does not fall as step rises from 0, the
        # two-variable optimum is the three-variable one (always so without decode data and
        # a zero step prior: a02 = a12 = b2 = 0 exactly, so the two-term model's numbers are
        # reproduced bit for bit). Otherwise the optimum has step > 0.
        if not a02 * intercept + a12 * slope - b2 < 0.0:
            self._intercept, self._slope, self._step = intercept, slope, 0.0
            return
        if not decoding:
            full = _full3(a00, a01, a02, a11, a12, a22, b0, b1, b2)
            if full is not None:
                self._intercept, self._slope, self._step = full
                return
        self._intercept, self._slope, self._step = _step_faces(
            a00, a01, a02, a11, a12, a22, b0, b1, b2
        )

    def information(self) -> tuple[tuple[tuple[float, ...], ...], tuple[float, ...]]:
        """The information form ``(A, b)`` the fit solves (``x = (1, tokens, longest)``, prior
        included): the fit minimises ``θᵀAθ − 2bᵀθ`` over ``θ ≥ 0``. For tests and
        diagnostics, not the hot path."""
        a = (
            (self._a00, self._a01, self._a02),
            (self._a01, self._a11, self._a12),
            (self._a02, self._a12, self._a22),
        )
        return a, (self._b0, self._b1, self._b2)

    def fit_objective(self, intercept: float, slope: float, step: float = 0.0) -> float:
        """The objective ``θᵀAθ − 2bᵀθ`` (the weighted squared error up to a constant) at
        ``θ = (intercept, slope, step)``; the fitted coefficients minimise it over ``θ ≥ 0``."""
        a, b = self.information()
        theta = (intercept, slope, step)
        quad = sum(theta[i] * a[i][j] * theta[j] for i in range(3) for j in range(3))
        return quad - 2.0 * sum(b[i] * theta[i] for i in range(3))

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
    def step(self) -> float:
        """Seconds per decode step: paid once per output position of the batch's longest
        output, whatever the batch size (0 for a device without a decode loop)."""
        return self._step

    @property
    def mean_longest(self) -> float:
        """The recent (forgetting-weighted) mean ``longest`` of the batches learned from: the
        typical decode length, for fluid estimates that price a batch's fixed cost as
        ``intercept + step × mean_longest`` (0 without decode data)."""
        return self._longest_mean

    @property
    def upper_factor(self) -> float:
        """``upper(t, l) / predict(t, l)``: 1 + the larger of ``spread_z`` × the RMS relative
        residual and the ``tail_quantile`` of the last 64 relative residuals (once 16 are
        known) — the margin is widened by what the device really did, not by a normal law."""
        return self._upper_factor

    def coefficients(self) -> tuple[float, float, float, float]:
        """``(intercept, slope, step, upper_factor)`` in one call, for paths that need all."""
        return self._intercept, self._slope, self._step, self._upper_factor

    @property
    def relative_spread(self) -> float:
        """Root-mean-square relative error of recent predictions."""
        return math.sqrt(self._mean_sq_rel)

    @property
    def observations(self) -> int:
        return self._observations

    def predict(self, tokens: float, longest: float = 0) -> float:
        """Expected device seconds for a batch of ``tokens`` whose longest output budget is
        ``longest``."""
        return (self._intercept + self._step * longest) + self._slope * tokens

    def upper(self, tokens: float, longest: float = 0) -> float:
        """A prediction a real batch should rarely exceed (for must-not-be-late decisions)."""
        return (
            (self._intercept + self._step * longest) + self._slope * tokens
        ) * self._upper_factor

    def snapshot(self) -> CostSnapshot:
        return CostSnapshot(
            intercept_s=self._intercept,
            slope_s_per_token=self._slope,
            relative_spread=self.relative_spread,
            observations=self._observations,
            step_s=self._step,
        )


def _nnls2(a00: float, a01: float, a11: float, b0: float, b1: float) -> tuple[float, float]:
    """Two-variable NNLS ``min θᵀAθ − 2bᵀθ, θ ≥ 0`` (intercept, slope) — the two-term model's
    solve, unchanged, so its results are reproduced exactly."""
    det = a00 * a11 - a01 * a01
    if det > _SINGULAR * a00 * a11:
        intercept = (a11 * b0 - a01 * b1) / det
        slope = (a00 * b1 - a01 * b0) / det
        if intercept >= 0.0 and slope >= 0.0:
            return intercept, slope
    # The unconstrained optimum lies outside the feasible quadrant, so the constrained one is
    # on a boundary: hold one coefficient at zero and re-solve for the other, then keep
    # whichever boundary point fits better (objective θᵀAθ − 2bᵀθ).
    best = (0.0, 0.0, 0.0)
    slope_only = max(0.0, b1 / a11) if a11 > 0 else 0.0
    cost = a11 * slope_only * slope_only - 2.0 * b1 * slope_only
    if cost < best[0]:
        best = (cost, 0.0, slope_only)
    intercept_only = max(0.0, b0 / a00) if a00 > 0 else 0.0
    cost = a00 * intercept_only * intercept_only - 2.0 * b0 * intercept_only
    if cost < best[0]:
        best = (cost, intercept_only, 0.0)
    return best[1], best[2]


def _full3(
    a00: float,
    a01: float,
    a02: float,
    a11: float,
    a12: float,
    a22: float,
    b0: float,
    b1: float,
    b2: float,
) -> tuple[float, float, float] | None:
    """The unconstrained optimum (``Aθ = b`` by cofactors) if it is non-negative — then it is
    the constrained one — else ``None`` (also for a numerically singular ``A``)."""
    c00 = a11 * a22 - a12 * a12
    c01 = a02 * a12 - a01 * a22
    c02 = a01 * a12 - a02 * a11
    det = a00 * c00 + a01 * c01 + a02 * c02
    if not det > _SINGULAR * a00 * a11 * a22:
        return None
    c11 = a00 * a22 - a02 * a02
    c12 = a01 * a02 - a00 * a12
    c22 = a00 * a11 - a01 * a01
    x0 = (c00 * b0 + c01 * b1 + c02 * b2) / det
    x1 = (c01 * b0 + c11 * b1 + c12 * b2) / det
    x2 = (c02 * b0 + c12 * b1 + c22 * b2) / det
    if x0 >= 0.0 and x1 >= 0.0 and x2 >= 0.0:
        return x0, x1, x2
    return None


def _step_faces(
    a00: float,
    a01: float,
    a02: float,
    a11: float,
    a12: float,
    a22: float,
    b0: float,
    b1: float,
    b2: float,
) -> tuple[float, float, float]:
    """The NNLS optimum when it is known to have ``step > 0`` and not to be the unconstrained
    one: on one of the faces {intercept, step}, {slope, step}, {step}. Each face's
    unconstrained optimum solves ``A_FF θ_F = b_F``, where the objective is ``−b_F·θ_F``; the
    best feasible one is the constrained optimum (the optimum is the unconstrained optimum of
    its own face, and every candidate is feasible)."""
    # Step alone: a22 > 0 always (the prior's contrast), and b2 > 0 here (the gradient along
    # step at the face step = 0 was negative, and a02, a12 and that face's optimum are all
    # non-negative).
    s = b2 / a22
    best = (-b2 * s, 0.0, 0.0, s)
    # Intercept and step.
    det = a00 * a22 - a02 * a02
    if det > _SINGULAR * a00 * a22:
        x0 = (a22 * b0 - a02 * b2) / det
        x2 = (a00 * b2 - a02 * b0) / det
        if x0 >= 0.0 and x2 >= 0.0:
            value = -(b0 * x0 + b2 * x2)
            if value < best[0]:
                best = (value, x0, 0.0, x2)
    # Slope and step.
    det = a11 * a22 - a12 * a12
    if det > _SINGULAR * a11 * a22:
        x1 = (a22 * b1 - a12 * b2) / det
        x2 = (a11 * b2 - a12 * b1) / det
        if x1 >= 0.0 and x2 >= 0.0:
            value = -(b1 * x1 + b2 * x2)
            if value < best[0]:
                best = (value, 0.0, x1, x2)
    return best[1], best[2], best[3]
