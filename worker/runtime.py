"""The model runtime interface and the simulated GPU behind it.

What it decides: what executing a batch means to the worker — per-item outputs, token usage
and the device time spent — behind a small protocol, so a real runtime is one adapter away.
:class:`SimulatedDevice` is the calibrated stand-in (design section 1): a batch takes
``(intercept + slope * batch tokens) / speed * (1 + (2U - 1) * jitter)`` where batch tokens are
``Σ (input_tokens + max_output_tokens)``, exactly the cost shape of the benchmark workload.

Why it honours cancellation by construction: the device "runs" by awaiting a sleep, so an
``asyncio.CancelledError`` (a cancelled RPC, a drain running out of grace) frees the device at
once instead of letting a hedge loser burn capacity (known defect 7). Faults are injected per
batch by a :class:`~worker.faults.FaultInjector`. Nothing here knows about gRPC.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from common.clock import Clock, MonotonicClock
from common.cost_samples import CostSampleValue
from common.rng import Rng, SeededRng
from worker.faults import FaultInjector, FaultKind, FaultPlan

__all__ = [
    "MAX_OUTPUT_WORDS",
    "WARMUP_BATCHES",
    "CostSampleValue",
    "DeviceFault",
    "ItemOutput",
    "ModelRuntime",
    "RuntimeBusy",
    "RuntimeResult",
    "RuntimeStartError",
    "SimulatedDevice",
    "WorkItem",
    "batch_tokens",
    "generate_text",
    "samples_from_tuples",
]

# Generated text is a short stand-in: at most this many words, however many tokens were asked.
MAX_OUTPUT_WORDS = 24

_VOCABULARY = (
    "amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo",
    "juniper", "kelp", "lagoon", "meadow", "nimbus", "opal", "prairie", "quartz", "river",
    "sierra", "tundra", "umber", "valley", "willow", "xenon", "yarrow", "zephyr", "aurora",
    "boreal", "canyon", "dune", "estuary", "glacier",
)  # fmt: skip


class DeviceFault(Exception):
    """The device failed the batch (a real runtime error, or an injected fault).

    The message is kept in the typed status the gateway sees, so a backend's own words
    (an ONNX Runtime error, a remote server's status message) reach the operator."""


class RuntimeBusy(Exception):
    """The runtime refused the batch as overloaded (a remote backend's RESOURCE_EXHAUSTED or
    UNAVAILABLE): backpressure, answered as REPLICA_BUSY — never a fault for the breaker."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RuntimeStartError(Exception):
    """The runtime cannot serve at all (bad model file, wrong tensor names, backend model
    missing): the worker exits at start with this one-line message, never at the first
    request."""


@dataclass(frozen=True)
class WorkItem:
    """One request in a batch, as the runtime sees it."""

    id: str
    input: str
    input_tokens: int
    max_output_tokens: int


@dataclass(frozen=True)
class ItemOutput:
    """One item's result."""

    id: str
    output: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class RuntimeResult:
    """A finished batch: outputs in item order, measured device time, total work tokens."""

    outputs: tuple[ItemOutput, ...]
    device_time_s: float
    batch_tokens: int


class ModelRuntime(Protocol):
    """What the worker needs from a model runtime.

    ``kind`` names it for operators (``simulated``, ``onnx``, ``oip``). ``start`` loads or
    connects and checks the model contract (raises :class:`RuntimeStartError`); ``ready``
    says whether it can take a batch now (a remote backend's readiness; always True
    in-process); ``close`` releases what ``start`` took.

    ``warm_up`` (after ``start``, before the worker registers) runs or reports a few real
    batches of different sizes and returns what each cost, as :class:`CostSampleValue`
    (items, batch tokens, longest output budget, device seconds). The worker sends them with
    its registration and every gateway seeds the replica's cost model from them, so the first
    request already has a prediction of the replica's *real* cost — a device whose batches
    take 30 s is then given 30 s and more, not timed out by a guess. Rules:

    * at least two batches of different work tokens (one pins only the cost at one size),
      small ones (the warm-up of a slow device costs about two of its fixed costs), at most
      ``MAX_WARMUP_SAMPLES`` (8);
    * never with injected faults (fail, hang): a ``--fail-rate 1`` worker must register;
    * ``()`` is allowed (nothing measured): gateways then give the replica's first batch
      until its requests must be answered, and learn from it.

    A runtime that already measured batches in ``start`` (ONNX, OIP: ``warmup_samples`` of
    ``(items, batch_tokens, longest_output, seconds)``) returns them:
    ``return samples_from_tuples(self.warmup_samples)``.
    """

    kind: str

    async def start(self) -> None:
        """Load, connect, check the contract; raises :class:`RuntimeStartError`."""
        ...

    def ready(self) -> bool:
        """Whether a batch sent now can run (False: the backend is away)."""
        ...

    async def close(self) -> None:
        """Release the model, threads and connections."""
        ...

    def estimate_s(self, batch_tokens: int) -> float:
        """Predicted device time of a batch of ``batch_tokens`` work tokens (no jitter)."""
        ...

    async def execute(self, items: Sequence[WorkItem]) -> RuntimeResult:
        """Run the batch; raises :class:`DeviceFault` on failure, :class:`RuntimeBusy` when
        the backend refuses it as overloaded; cancellable at any await."""
        ...

    async def warm_up(self) -> tuple[CostSampleValue, ...]:
        """Measured warm-up batches (see the class docstring); no injected faults."""
        ...


def batch_tokens(items: Sequence[WorkItem]) -> int:
    """Work tokens of a batch: every item's prompt plus its generation budget."""
    return sum(item.input_tokens + item.max_output_tokens for item in items)


def samples_from_tuples(
    samples: Sequence[tuple[int, int, int, float]],
) -> tuple[CostSampleValue, ...]:
    """``(items, batch_tokens, longest_output, seconds)`` tuples as warm-up samples."""
    return tuple(
        CostSampleValue(
            items=int(items),
            batch_tokens=int(tokens),
            longest_output_tokens=int(longest),
            seconds=float(seconds),
        )
        for items, tokens, longest, seconds in samples
    )


# The simulated device's warm-up: (input tokens, max output tokens) per item, per batch. Two
# small batches of different work (16 and 2,048 tokens: 18 and 63 ms on the default device),
# so a device whose fixed cost is 5 s registers after ~10 s, and the per-token cost is seen
# over a span wide enough that one batch's jitter does not pass for a slope.
WARMUP_BATCHES: tuple[tuple[tuple[int, int], ...], ...] = (
    ((8, 8),),
    ((32, 224),) * 8,
)


def generate_text(prompt: str, output_tokens: int) -> str:
    """Deterministic stand-in output: words drawn from a hash of the prompt.

    ``min(output_tokens, MAX_OUTPUT_WORDS)`` words; the same prompt always gives the same text.
    """
    words = min(output_tokens, MAX_OUTPUT_WORDS)
    digest = b""
    counter = 0
    while len(digest) < words:
        digest += hashlib.sha256(f"{counter}:{prompt}".encode()).digest()
        counter += 1
    return " ".join(_VOCABULARY[b % len(_VOCABULARY)] for b in digest[:words])


def _never() -> Awaitable[None]:
    """An await that only ends by cancellation: a hung device."""
    return asyncio.get_running_loop().create_future()


class SimulatedDevice:
    """A calibrated simulated accelerator (see the module docstring for the cost model)."""

    kind = "simulated"

    def __init__(
        self,
        *,
        intercept_ms: float = 18.0,
        ms_per_token: float = 0.022,
        speed: float = 1.0,
        jitter: float = 0.08,
        seed: int = 0,
        rng: Rng | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        faults: FaultInjector | None = None,
    ) -> None:
        if intercept_ms < 0 or ms_per_token < 0:
            raise ValueError("intercept_ms and ms_per_token must be >= 0")
        if speed <= 0:
            raise ValueError("speed must be > 0")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        self.intercept_ms = intercept_ms
        self.ms_per_token = ms_per_token
        self.speed = speed
        self.jitter = jitter
        self._rng: Rng = rng if rng is not None else SeededRng(seed)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._sleep = sleep
        self._faults = faults

    async def start(self) -> None:
        return None

    def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def estimate_s(self, batch_tokens: int) -> float:
        return (self.intercept_ms + self.ms_per_token * batch_tokens) / self.speed / 1000.0

    def sample_s(self, batch_tokens: int) -> float:
        """One draw of the device time for a batch (consumes one random number)."""
        u = self._rng.random()
        return self.estimate_s(batch_tokens) * (1.0 + (2.0 * u - 1.0) * self.jitter)

    async def warm_up(self) -> tuple[CostSampleValue, ...]:
        """Runs :data:`WARMUP_BATCHES` for real (jitter included), without fail or hang
        faults; a ``--slowdown`` applies, as it would to a degraded device's own warm-up."""
        plan = FaultPlan(
            FaultKind.NONE, slowdown=self._faults.slowdown if self._faults is not None else 1.0
        )
        samples = []
        for n, batch in enumerate(WARMUP_BATCHES):
            items = [
                WorkItem(f"warm-up-{n}-{i}", "warm up", input_tokens, output_tokens)
                for i, (input_tokens, output_tokens) in enumerate(batch)
            ]
            result = await self._run(items, plan)
            samples.append(
                CostSampleValue(
                    items=len(items),
                    batch_tokens=result.batch_tokens,
                    longest_output_tokens=max(item.max_output_tokens for item in items),
                    seconds=result.device_time_s,
                )
            )
        return tuple(samples)

    async def execute(self, items: Sequence[WorkItem]) -> RuntimeResult:
        return await self._run(items, self._faults.plan() if self._faults is not None else None)

    async def _run(self, items: Sequence[WorkItem], plan: FaultPlan | None) -> RuntimeResult:
        tokens = batch_tokens(items)
        started = self._clock.now()
        if plan is not None and plan.kind is FaultKind.FAIL:
            await self._sleep(plan.fail_after_s)
            raise DeviceFault("injected device fault")
        if plan is not None and plan.kind is FaultKind.HANG:
            await _never()
        duration = self.sample_s(tokens) * (plan.slowdown if plan is not None else 1.0)
        if duration > 0.0:  # a zero-time device (overhead benchmarks) costs no loop turn
            await self._sleep(duration)
        outputs = tuple(
            ItemOutput(
                id=item.id,
                output=generate_text(item.input, item.max_output_tokens),
                input_tokens=item.input_tokens,
                output_tokens=item.max_output_tokens,
            )
            for item in items
        )
        return RuntimeResult(outputs, self._clock.now() - started, tokens)
