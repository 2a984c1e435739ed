"""Deterministic evidence for canary tests: seeded numpy draws, no clocks, no sleeps."""

from __future__ import annotations

import numpy as np

from controller.canary import ArmEvidence, Decision, RolloutRun


def arm(
    rng: np.random.Generator,
    requests: int,
    *,
    error_rate: float = 0.0,
    median_s: float = 0.05,
    sigma: float = 0.35,
) -> ArmEvidence:
    """``requests`` requests: binomial failures, log-normal latencies for the rest."""
    errors = int(rng.binomial(requests, error_rate)) if requests else 0
    latencies = median_s * np.exp(rng.normal(0.0, sigma, requests - errors))
    return ArmEvidence(requests=requests, errors=errors, shed=0, latencies_s=latencies)


def drive(
    run: RolloutRun,
    rng: np.random.Generator,
    *,
    rate: float = 200.0,
    seconds: float = 600.0,
    canary_error_rate: float = 0.002,
    baseline_error_rate: float = 0.002,
    canary_median_s: float = 0.05,
    start: float = 0.0,
) -> list[tuple[float, Decision]]:
    """Feed one second of traffic per tick until the run ends or ``seconds`` pass."""
    decisions: list[tuple[float, Decision]] = []
    t = start
    while not run.done and t < start + seconds:
        t += 1.0
        share = run.canary_percent / 100.0
        n_canary = int(rng.poisson(rate * share))
        n_base = int(rng.poisson(rate * (1.0 - share)))
        run.observe(
            arm(rng, n_base, error_rate=baseline_error_rate),
            arm(rng, n_canary, error_rate=canary_error_rate, median_s=canary_median_s),
            t,
        )
        decision = run.tick(t)
        if decision is not None:
            decisions.append((t, decision))
    return decisions


def until_decision(
    run: RolloutRun,
    rng: np.random.Generator,
    *,
    baseline: int,
    canary: int,
    canary_error_rate: float,
) -> tuple[float, Decision]:
    """Feed fixed per-second request counts until ``run`` decides something."""
    t = 0.0
    while True:
        t += 1.0
        run.observe(arm(rng, baseline), arm(rng, canary, error_rate=canary_error_rate), t)
        decision = run.tick(t)
        if decision is not None:
            return t, decision
