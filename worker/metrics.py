"""The worker's domain metrics (``halcyon_worker_*``), registered on the host's registry.

What it decides: what an operator can see about a replica — batches by outcome, device time,
batch size and tokens, slots in use — with small fixed label domains (design section 6). Every
outcome label is pre-created, so a rate query works before the first failure happens.

Every series carries the ``model`` and ``version`` the worker serves (one of each per process,
fixed at start), so dashboards and alerts group replicas by version without a join. They are
bound once: each family's children for this (model, version) — and for every outcome — are
made at construction and kept, so the per-batch updates cost what they did before the labels
(a dict lookup and the child's own increment or observation, no ``.labels()`` call per batch).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["BatchOutcome", "WorkerMetrics"]


class BatchOutcome(StrEnum):
    """How an ExecuteBatch call ended (the ``outcome`` label)."""

    OK = "ok"
    DEVICE_FAULT = "device_fault"
    CANCELLED = "cancelled"  # the caller cancelled (e.g. a losing hedge)
    DRAINED = "drained"  # cancelled because a drain ran out of grace
    BUSY = "busy"  # refused: every slot busy
    DRAINING = "draining"  # refused: the replica is draining
    INVALID = "invalid"  # refused: malformed or for another model


_DEVICE_BUCKETS = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class WorkerMetrics:
    """``halcyon_worker_*`` families, bound to the worker's (model, version)."""

    def __init__(self, registry: CollectorRegistry, *, model: str, version: str) -> None:
        served = ("model", "version")
        batches = Counter(
            "halcyon_worker_batches",
            "ExecuteBatch calls by outcome.",
            [*served, "outcome"],
            registry=registry,
        )
        self.batches = {o: batches.labels(model, version, o.value) for o in BatchOutcome}
        self.device_seconds = Histogram(
            "halcyon_worker_batch_device_seconds",
            "Measured device time of completed batches.",
            served,
            buckets=_DEVICE_BUCKETS,
            registry=registry,
        ).labels(model, version)
        self.batch_size = Histogram(
            "halcyon_worker_batch_size",
            "Items per completed batch.",
            served,
            buckets=_SIZE_BUCKETS,
            registry=registry,
        ).labels(model, version)
        self.batch_tokens = Histogram(
            "halcyon_worker_batch_tokens",
            "Work tokens (input + max output) per completed batch.",
            served,
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        ).labels(model, version)
        self.busy_slots = Gauge(
            "halcyon_worker_busy_slots", "Slots running a batch now.", served, registry=registry
        ).labels(model, version)
        self.slots = Gauge(
            "halcyon_worker_slots", "Slots on this replica.", served, registry=registry
        ).labels(model, version)
        self.draining = Gauge(
            "halcyon_worker_draining",
            "1 while the replica is draining.",
            served,
            registry=registry,
        ).labels(model, version)
        self.controller_connected = Gauge(
            "halcyon_worker_controller_connected",
            "1 while the registration stream holds a lease.",
            served,
            registry=registry,
        ).labels(model, version)
        self.controller_reconnects = Counter(
            "halcyon_worker_controller_reconnects",
            "Registration stream (re)connection attempts after a failure or a closed stream.",
            served,
            registry=registry,
        ).labels(model, version)

    def observe_outcome(self, outcome: BatchOutcome) -> None:
        self.batches[outcome].inc()

    def observe_completed(self, device_s: float, size: int, tokens: int) -> None:
        self.device_seconds.observe(device_s)
        self.batch_size.observe(size)
        self.batch_tokens.observe(tokens)

    def track_slots(self, capacity: int, busy: Callable[[], float]) -> None:
        """Export the slot count and read busy slots live at scrape time."""
        self.slots.set(capacity)
        self.busy_slots.set_function(busy)
