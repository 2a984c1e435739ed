"""Deadline-aware batching: one EDF queue per (model, version), pure and clock-injected.

What it decides: for every request, whether it is admitted; for every free replica slot,
which requests run together and when; under overload, which requests are let go so that the
most requests (or tokens) still finish by their deadlines; and how long each replica takes,
learned from every batch it runs. The same :class:`DeadlineBatcher` serves the gateway (many
replicas, several slots each) and the benchmark simulator (one device, one slot) — nothing here
knows about gRPC, asyncio or the wall clock.

Modules: ``batcher`` (the policy object), ``planner`` (the batched Moore–Hodgson plan),
``cost_model`` (per-replica non-negative RLS of the per-batch, per-token and per-decode-step
costs), ``horizon`` (how long one batch may run, and which deadline class that protects),
``shed_threshold`` (the admission size limit under sustained overload), ``deadline_mix`` (the
recent arrival mix), ``records`` (the vocabulary), ``config``.

Usage from an asyncio gateway (one batcher per (model, version); ``answer_*`` are the
servicer's own helpers)::

    batcher: DeadlineBatcher[RequestHandle] = DeadlineBatcher(MonotonicClock(), BatcherConfig())
    batcher.add_replica(ReplicaSlots("gpu-a", slots=2))    # each replica learns its own cost
    batcher.add_replica(ReplicaSlots("gpu-b"), cost_model=OnlineCostModel(0.030, 0.00009))

    # (a) admission: an immediate, typed answer
    result = batcher.submit(                              # tokens: input + output budget
        handle, tokens=n, output_tokens=max_out, deadline=clock.now() + budget_s, lane=Lane.BULK
    )
    if isinstance(result, Rejected):
        answer_rejected(handle, result.reason, result.predicted_completion, result.retry_after)

    # (c) after every event (submit, completion, timer): fill free slots
    def pump() -> None:
        for replica_id in batcher.free_replicas():
            batch = batcher.take_batch(replica_id)         # None: keep waiting
            if batch is not None:                          # batch.reason says why now
                asyncio.create_task(run(batch))
        for dropped in batcher.take_dropped():             # (d) shed or evicted, with reasons
            answer_dropped(dropped.item.payload, dropped.reason, dropped.predicted_completion)
        wake = batcher.next_wakeup()                       # (b) never within a tick of now
        rearm_timer(wake)                                  # on firing: batcher.poll(); pump()

    async def run(batch: Batch[RequestHandle]) -> None:
        try:
            reply = await execute_on(batch.replica_id, batch.items)
        except ReplicaFault:
            for item in batcher.fail(batch):               # (e) failures free the slot ...
                answer_failed(item.payload)
        else:
            batcher.complete(batch, reply.device_seconds)  # ... completions also teach the model
            answer_served(batch, reply)
        pump()

    # (f) membership follows the fleet: add_replica / remove_replica at any time; the batcher
    #     reads a replica's slots from the record it was handed (any ``Seat``: in the gateway
    #     the membership owner's record, gateway.replicas), so a new record is a new add_replica
    # (g) shutdown: close() refuses new work, queued work keeps dispatching; drain() returns
    #     whatever is still queued so every caller gets an answer.

Rejections map onto the gateway's error model: ``DEADLINE_UNREACHABLE`` → DEADLINE_EXCEEDED;
``QUEUE_FULL`` / ``NO_CAPACITY`` / ``SHED_FOR_GOODPUT`` → UNAVAILABLE with ``retry_after``.
"""

from gateway.batching.batcher import BatcherSnapshot, DeadlineBatcher
from gateway.batching.config import BatcherConfig
from gateway.batching.cost_model import CostSnapshot, OnlineCostModel
from gateway.batching.records import (
    Accepted,
    Batch,
    BatchItem,
    Dropped,
    DropReason,
    FlushReason,
    Lane,
    Objective,
    PredictionParts,
    Rejected,
    ReplicaSlots,
    Seat,
)

__all__ = [
    "Accepted",
    "Batch",
    "BatchItem",
    "BatcherConfig",
    "BatcherSnapshot",
    "CostSnapshot",
    "DeadlineBatcher",
    "DropReason",
    "Dropped",
    "FlushReason",
    "Lane",
    "Objective",
    "OnlineCostModel",
    "PredictionParts",
    "Rejected",
    "ReplicaSlots",
    "Seat",
]
