"""What a gateway process is told at start: one :class:`GatewayConfig`.

What it decides: the defaults every gateway runs with when a flag does not say otherwise —
timeout, batching strategy and linger, report interval, and the adaptive limiter's tuning
(see the field comments for why each default is what it is). Apart so that the Infer path
(:mod:`gateway.infer_path`) can read it without importing the app that builds it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from common.serving import ServingOptions, TlsOptions
from gateway.admission import (
    GradientLimiterConfig,
    TenantRegistry,
)
from gateway.batching import Objective
from gateway.batching.fixed import BatchingStrategy


@dataclass
class GatewayConfig:
    """Everything a gateway process is told at start."""

    serving: ServingOptions
    tenants: TenantRegistry
    controller: str | None = None
    fleet_token: str = ""
    # Known only so that an operator token sent to Infer is refused as WRONG_ROLE.
    operator_token: str = ""
    gateway_id: str = field(default_factory=lambda: f"gw-{socket.gethostname()}-{os.getpid()}")
    default_timeout_s: float = 10.0
    seed: int = 0
    objective: Objective = Objective.ON_TIME_REQUESTS
    report_interval_s: float = 1.0
    # Gateways the deployment runs (``--expected-gateways``): before the controller's first
    # quota lease each enforces its tenants' quotas divided by this (ADR 0003). 1: alone, the
    # whole quota, as a gateway always did.
    expected_gateways: int = 1
    # How long an idle replica may be held back to let a batch grow. Zero: an idle replica
    # takes work at once (continuous batching) — batches grow by themselves while replicas are
    # busy, and waiting on an idle one only adds latency at light load.
    linger_s: float = 0.0
    # Which batcher serves (``--batching``): Halcyon's, or one of the seed's baselines (fixed
    # 32 items / 25 ms linger, or one request per batch) for a like-for-like comparison.
    batching: BatchingStrategy = BatchingStrategy.HALCYON
    controller_tls: TlsOptions | None = None
    worker_tls: TlsOptions | None = None
    # Batching raises latency with concurrency by design (bigger batches), so the limiter
    # tolerates a doubling before it reads a queue (Gradient2's default) plus 25 ms (on a fast
    # fleet a doubling is a few milliseconds, no overload next to deadlines in seconds), and
    # never cuts below what one batch per replica slot needs; the batcher sheds infeasible
    # work itself.
    limiter: GradientLimiterConfig = field(
        default_factory=lambda: GradientLimiterConfig(
            initial_limit=128.0, min_limit=32.0, tolerance=2.0, queue_slack_s=0.025
        )
    )
