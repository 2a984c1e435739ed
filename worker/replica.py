"""The replica's execution core: slots, in-flight batches, counters and draining.

What it decides: whether a batch runs (not draining, a slot free — else refused at once),
that the slot is released the moment the batch ends however it ends (success, device fault,
the caller cancelling, a drain cutting it off), how a drain goes: stop taking work, let
in-flight batches finish within the grace, cancel what is left, report both counts — and
that a drain can be undone (:meth:`Replica.undrain`): the replica takes work again, and a
later drain is a new one.

Each batch runs as its own task so a drain can cancel it and the waiting RPC can still answer
(UNAVAILABLE / REPLICA_DRAINING) instead of vanishing; when the RPC itself is cancelled the
batch task is cancelled with it, freeing the device (known defect 7). No gRPC here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from worker.descriptor import LoadSnapshot
from worker.runtime import DeviceFault, ModelRuntime, RuntimeResult, WorkItem, batch_tokens
from worker.slots import SlotTable

__all__ = ["DrainResult", "Replica", "ReplicaDraining", "ReplicaShuttingDown"]


class ReplicaDraining(Exception):
    """Refused because the replica is draining, or (``cut_off``) cancelled by the drain."""

    def __init__(self, message: str, *, cut_off: bool = False) -> None:
        super().__init__(message)
        self.cut_off = cut_off


class ReplicaShuttingDown(Exception):
    """An undrain refused: the process is stopping, so its drain is final."""


@dataclass(frozen=True)
class DrainResult:
    """How a drain ended."""

    batches_finished: int
    batches_cancelled: int


class Replica:
    """Runs batches on a :class:`ModelRuntime` within a :class:`SlotTable`."""

    def __init__(self, runtime: ModelRuntime, slots: SlotTable) -> None:
        self._runtime = runtime
        self._slots = slots
        self._inflight: set[asyncio.Task[RuntimeResult]] = set()
        self._draining = False
        self._drain_task: asyncio.Task[DrainResult] | None = None
        self.batches_total = 0
        self.batches_failed = 0

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def load(self) -> LoadSnapshot:
        return LoadSnapshot(
            busy_slots=self._slots.busy,
            batches_total=self.batches_total,
            batches_failed=self.batches_failed,
            draining=self._draining,
        )

    async def execute(self, batch_id: str, items: Sequence[WorkItem]) -> RuntimeResult:
        """Run a batch now or refuse at once.

        Raises :class:`ReplicaDraining`, :class:`~worker.slots.SlotsBusy` or
        :class:`~worker.runtime.DeviceFault`; cancelling the caller cancels the batch.
        """
        if self._draining:
            raise ReplicaDraining("replica is draining; send the batch to another replica")
        lease = self._slots.acquire(batch_id, self._runtime.estimate_s(batch_tokens(items)))
        try:
            task = asyncio.get_running_loop().create_task(
                self._runtime.execute(items), name=f"batch-{batch_id}"
            )
        except BaseException:
            self._slots.release(lease)
            raise
        self._inflight.add(task)

        def finished(t: asyncio.Task[RuntimeResult]) -> None:
            # Runs as soon as the task ends, however it ends: the slot is free from here on.
            self._slots.release(lease)
            self._inflight.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            if exc is None or isinstance(exc, DeviceFault):
                self.batches_total += 1
            if exc is not None:
                self.batches_failed += 1

        task.add_done_callback(finished)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                task.cancel()  # the caller went away: free the device now
                raise
            # Not our cancellation: the drain cut the batch off.
            raise ReplicaDraining(
                "batch cancelled: drain grace period ended", cut_off=True
            ) from None

    def stop_accepting(self) -> None:
        """Refuse new batches from now on (the first step of a drain)."""
        self._draining = True

    def undrain(self) -> bool:
        """Take batches again; False if the replica was not draining.

        A drain still waiting for in-flight batches keeps waiting for them (they were
        accepted and finish either way); the next drain starts afresh.
        """
        if not self._draining:
            return False
        self._draining = False
        self._drain_task = None
        return True

    async def drain(self, grace_s: float) -> DrainResult:
        """Stop taking batches; finish in-flight ones within ``grace_s``, cancel the rest.

        Idempotent: later calls wait for the first drain and return its result.
        """
        self._draining = True
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(grace_s))
        return await asyncio.shield(self._drain_task)

    async def _drain(self, grace_s: float) -> DrainResult:
        pending = set(self._inflight)
        if not pending:
            return DrainResult(0, 0)
        done, late = await asyncio.wait(pending, timeout=max(0.0, grace_s))
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
        finished = sum(1 for t in done if not t.cancelled())
        return DrainResult(batches_finished=finished, batches_cancelled=len(late))
