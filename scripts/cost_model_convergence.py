"""How fast the gateway's online cost model learns the real ONNX decoder, and re-learns it.

Runs the generated decoder in this process (ONNX Runtime, one thread, pinned to one core) on a
stream of batches shaped like ``halcyon loadtest``'s requests (1–16 items, prompts of 20–100
bytes, output budgets uniform in 64–255), and feeds each measured batch to the gateway's own
:class:`~gateway.batching.OnlineCostModel` exactly as the batcher does — the prediction is
taken *before* the batch is observed. The model starts as a gateway's does for a replica that
registered with warm-up samples (:func:`gateway.warmup.seeded_cost_model`, from the same
warm-up batches the ONNX worker measures at start). Halfway through, another process starts
spinning on the same core, so every batch takes about twice as long: how many batches until
the predictions are good again?

Prints, per phase, the median absolute relative error over successive windows of batches and
the number of batches until it falls below 15 %, and compares the three-term model
(``intercept + slope × tokens + step × longest``) with the two-term form the simulated device
obeys (the same class fed no output lengths). Draws ``docs/img/cost-model-convergence.png``:
relative error per batch for both forms, and the fitted curve beside measured batches.

    .venv/bin/python scripts/cost_model_convergence.py [--batches 240] [--preset small]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.cost_samples import CostSampleValue
from gateway.warmup import seeded_cost_model
from worker.onnx_engine import DecoderEngine
from worker.onnx_model import generate_preset

ROOT = Path(__file__).resolve().parents[1]
GOOD = 0.15  # "converged": median |relative error| over a window below this
WINDOW = 10


@dataclass(frozen=True)
class Measured:
    index: int
    items: int
    tokens: int
    longest: int
    seconds: float
    predicted3: float
    predicted2: float
    contended: bool


def _spin(core: int) -> None:  # pragma: no cover - runs in the hog process
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    while True:
        pass


def _batch(rng_state: list[int]) -> tuple[list[bytes], list[int]]:
    """A loadtest-shaped batch from a small LCG (deterministic, no numpy state)."""

    def draw(lo: int, hi: int) -> int:
        rng_state[0] = (rng_state[0] * 6364136223846793005 + 1442695040888963407) % 2**64
        return lo + (rng_state[0] >> 33) % (hi - lo + 1)

    items = draw(1, 16)
    prompts = [bytes(draw(97, 122) for _ in range(draw(20, 100))) for _ in range(items)]
    budgets = [draw(64, 255) for _ in range(items)]
    return prompts, budgets


def _warmup(engine: DecoderEngine) -> list[CostSampleValue]:
    """The ONNX worker's warm-up batches (worker/onnx_runtime.py): 1 x 16 → 16, 8 x 32 → 32,
    4 x 32 → 192."""
    engine.generate([b"w" * 8], [8])  # discarded, as the worker does
    samples = []
    for items, prompt, new in ((1, 16, 16), (8, 32, 32), (4, 32, 192)):
        started = time.perf_counter()
        engine.generate([b"w" * prompt] * items, [new] * items)
        seconds = time.perf_counter() - started
        samples.append(CostSampleValue(items, items * (prompt + new), new, seconds))
    return samples


def _converged_after(errors: list[float]) -> int | None:
    """Batches until the median |error| of a window of WINDOW batches is below GOOD."""
    for end in range(WINDOW, len(errors) + 1):
        if statistics.median(errors[end - WINDOW : end]) < GOOD:
            return end
    return None


def _summary(name: str, rows: list[Measured], attr: str) -> str:
    errors = [abs(getattr(r, attr) / r.seconds - 1.0) for r in rows]
    after = _converged_after(errors)
    tail = errors[len(errors) // 2 :]
    return (
        f"  {name}: first batch error {100 * errors[0]:.0f} %, "
        f"median |error| over the first 10 {100 * statistics.median(errors[:10]):.0f} %, "
        f"over the second half {100 * statistics.median(tail):.1f} %; "
        f"below {100 * GOOD:.0f} % (median of {WINDOW}) after "
        + (f"{after} batches" if after is not None else "never")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=240, help="batches in all (default 240)")
    parser.add_argument("--preset", default="small", help="model preset (default small)")
    parser.add_argument("--core", type=int, default=0, help="CPU the engine runs on (default 0)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "img" / "cost-model-convergence.png"
    )
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.core})
    with tempfile.TemporaryDirectory() as tmp:
        path = generate_preset(Path(tmp) / "model.onnx", args.preset)
        engine = DecoderEngine(str(path), threads=1)
    samples = _warmup(engine)
    three = seeded_cost_model(samples)
    two = seeded_cost_model(
        [CostSampleValue(s.items, s.batch_tokens, 0, s.seconds) for s in samples]
    )
    assert three is not None and two is not None
    state = [20261201]
    rows: list[Measured] = []
    hog: multiprocessing.Process | None = None
    try:
        for i in range(args.batches):
            contended = i >= args.batches // 2
            if contended and hog is None:
                hog = multiprocessing.Process(target=_spin, args=(args.core,), daemon=True)
                hog.start()
                time.sleep(0.2)
            prompts, budgets = _batch(state)
            tokens = sum(len(p) + b for p, b in zip(prompts, budgets, strict=True))
            longest = max(budgets)
            p3, p2 = three.predict(tokens, longest), two.predict(tokens)
            started = time.perf_counter()
            engine.generate(prompts, budgets)
            seconds = time.perf_counter() - started
            three.observe(tokens, seconds, longest=longest)
            two.observe(tokens, seconds)
            rows.append(Measured(i, len(prompts), tokens, longest, seconds, p3, p2, contended))
    finally:
        if hog is not None:
            hog.terminate()
            hog.join()
    alone = [r for r in rows if not r.contended]
    shared = [r for r in rows if r.contended]
    slowdown = statistics.median(r.seconds / r.predicted3 for r in shared[:5])
    print(f"{args.preset} decoder, {args.batches} batches, warm-up: {samples}")
    print("after the worker starts (the model seeded by the warm-up batches):")
    print(_summary("3-term (intercept + slope x tokens + step x longest)", alone, "predicted3"))
    print(_summary("2-term (intercept + slope x tokens)", alone, "predicted2"))
    print(f"after another process takes the core (first batches {slowdown:.2f}x the prediction):")
    print(_summary("3-term", shared, "predicted3"))
    print(_summary("2-term", shared, "predicted2"))
    print(
        f"fit at the end: intercept {1000 * three.intercept:.2f} ms, "
        f"slope {1e6 * three.slope:.2f} us/token, step {1000 * three.step:.3f} ms/step, "
        f"relative spread {100 * three.relative_spread:.1f} %"
    )
    _plot(rows, args.out)
    print(f"wrote {args.out}")
    return 0


def _plot(rows: list[Measured], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.2), dpi=110)
    idx = [r.index for r in rows]
    left.plot(idx, [r.predicted2 / r.seconds - 1 for r in rows], ".", ms=3, label="2-term")
    left.plot(idx, [r.predicted3 / r.seconds - 1 for r in rows], ".", ms=3, label="3-term")
    change = next((r.index for r in rows if r.contended), None)
    if change is not None:
        left.axvline(change, color="0.4", linestyle="--", linewidth=1)
        left.annotate(" another process takes the core", (change, 0.8), fontsize=8)
    left.axhline(0, color="0.6", linewidth=0.8)
    left.set_ylim(-1, 1.5)
    left.set_xlabel("batch")
    left.set_ylabel("prediction / measured − 1")
    left.set_title("Prediction error, made before each batch")
    left.legend()
    alone = [r for r in rows if not r.contended][-60:]
    right.plot(
        [r.tokens for r in alone], [1000 * r.seconds for r in alone], "o", ms=3, label="measured"
    )
    right.plot(
        [r.tokens for r in alone], [1000 * r.predicted3 for r in alone], "x", ms=4, label="3-term"
    )
    right.plot(
        [r.tokens for r in alone], [1000 * r.predicted2 for r in alone], "+", ms=4, label="2-term"
    )
    right.set_xlabel("batch work tokens (Σ input + output)")
    right.set_ylabel("ms")
    right.set_title("Last 60 uncontended batches: fit beside measured")
    right.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
