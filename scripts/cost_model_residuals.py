"""How well does each cost form predict measured batches? Online replay, both forms.

Reads measured batches from a CSV and replays them, batch by batch, through two
:class:`~gateway.batching.OnlineCostModel` instances exactly as the batcher uses them — the
prediction for each batch is made *before* the model learns from it:

* the two-term form ``intercept + slope × tokens`` (``longest`` withheld from the model), the
  simulated device's shape;
* the three-term form ``intercept + slope × tokens + step × longest`` (ADR 0001, amendment).

For each form it prints the RMS and mean relative residual ``measured / predicted − 1`` and
the final coefficients. The CSV has a header and either the columns ``items, batch_tokens,
longest_output, seconds`` (one measured batch per row, in the order they ran), or those
written by ``scripts/onnx_cost_curve.py`` (``preset, batch, output_tokens, prompt_bytes, ...,
seconds``: a grid of uniform batches, converted with the gateway's 4-bytes-per-token input
estimate). Rows with a ``preset`` column are replayed per preset (one model per runtime, as
one model per replica). A grid measured in sweep order is no stream of batches: ``--shuffle``
and ``--passes`` replay it as one (shuffled each pass).

    .venv/bin/python scripts/cost_model_residuals.py docs/img/onnx-cost-curve.csv --passes 5 \\
        --shuffle 1
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.batching import OnlineCostModel
from gateway.validation import BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class MeasuredBatch:
    """One batch as it ran: its requests, work tokens, longest output budget and seconds."""

    items: int
    batch_tokens: int
    longest_output: int
    seconds: float
    group: str = ""  # the runtime it ran on (a preset), when the CSV names one


@dataclass(frozen=True, slots=True)
class FormResult:
    """One cost form's online replay over a group of batches."""

    form: str
    batches: int
    rms_relative: float
    mean_relative: float
    intercept_s: float
    slope_s_per_token: float
    step_s: float


def read_batches(path: Path) -> list[MeasuredBatch]:
    """The measured batches in ``path``, in file order (see the module docstring)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    batches: list[MeasuredBatch] = []
    for row in rows:
        if "batch_tokens" in row:
            batches.append(
                MeasuredBatch(
                    int(row["items"]),
                    int(row["batch_tokens"]),
                    int(row["longest_output"]),
                    float(row["seconds"]),
                    row.get("preset") or "",
                )
            )
        elif "output_tokens" in row and "prompt_bytes" in row:
            items = int(row["batch"])
            output = int(row["output_tokens"])
            prompt = max(1, -(-int(row["prompt_bytes"]) // BYTES_PER_TOKEN))
            batches.append(
                MeasuredBatch(
                    items, items * (prompt + output), output, float(row["seconds"]), row["preset"]
                )
            )
        else:
            raise ValueError(
                f"{path}: expected columns items, batch_tokens, longest_output, seconds"
            )
    return batches


def replay(batches: Sequence[MeasuredBatch], *, three_term: bool, warmup: int = 0) -> FormResult:
    """Replays ``batches`` through a fresh model with the gateway's default prior; residuals
    of the predictions made before each update, skipping the first ``warmup``."""
    model = OnlineCostModel()
    residuals: list[float] = []
    for index, batch in enumerate(batches):
        longest = batch.longest_output if three_term else 0
        predicted = model.predict(batch.batch_tokens, longest)
        if index >= warmup and predicted > 0.0:
            residuals.append(batch.seconds / predicted - 1.0)
        model.observe(batch.batch_tokens, batch.seconds, longest)
    n = len(residuals)
    rms = math.sqrt(sum(r * r for r in residuals) / n) if n else math.nan
    mean = sum(residuals) / n if n else math.nan
    return FormResult(
        "3-term" if three_term else "2-term",
        n,
        rms,
        mean,
        model.intercept,
        model.slope,
        model.step,
    )


def stream(
    batches: Sequence[MeasuredBatch], *, passes: int = 1, shuffle: int | None = None
) -> list[MeasuredBatch]:
    """``passes`` replays of ``batches`` back to back, each shuffled when ``shuffle`` seeds."""
    rng = random.Random(shuffle)
    out: list[MeasuredBatch] = []
    for _ in range(passes):
        one = list(batches)
        if shuffle is not None:
            rng.shuffle(one)
        out.extend(one)
    return out


def report(
    batches: Sequence[MeasuredBatch],
    out: TextIO,
    *,
    passes: int = 1,
    shuffle: int | None = None,
    warmup: int = 0,
) -> dict[str, tuple[FormResult, FormResult]]:
    """Prints both forms' residuals per group; returns them by group."""
    groups: dict[str, list[MeasuredBatch]] = {}
    for batch in batches:
        groups.setdefault(batch.group, []).append(batch)
    results: dict[str, tuple[FormResult, FormResult]] = {}
    out.write(
        "| group | form   | batches | RMS rel. residual | mean rel. residual "
        "| intercept ms | µs/token | µs/step |\n"
        "|:------|:-------|--------:|------------------:|-------------------:"
        "|-------------:|---------:|--------:|\n"
    )
    for name, group in groups.items():
        replayed = stream(group, passes=passes, shuffle=shuffle)
        pair = (
            replay(replayed, three_term=False, warmup=warmup),
            replay(replayed, three_term=True, warmup=warmup),
        )
        results[name] = pair
        for r in pair:
            out.write(
                f"| {name or '-'} | {r.form} | {r.batches} | {r.rms_relative:.2%} "
                f"| {r.mean_relative:+.2%} | {r.intercept_s * 1e3:.3f} "
                f"| {r.slope_s_per_token * 1e6:.3f} | {r.step_s * 1e6:.2f} |\n"
            )
    return results


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path, help="measured batches (see the module docstring)")
    parser.add_argument(
        "--passes", type=int, default=1, help="replay the batches this many times (default 1)"
    )
    parser.add_argument(
        "--shuffle", type=int, default=None, metavar="SEED", help="shuffle each pass (seeded)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="leave the first N predictions out of the residuals (default 0: the prior's "
        "first guesses count, as they do for the batcher)",
    )
    args = parser.parse_args(argv)
    if args.passes < 1 or args.warmup < 0:
        parser.error("--passes must be at least 1 and --warmup non-negative")
    batches = read_batches(args.csv)
    if not batches:
        parser.error(f"{args.csv}: no batches")
    report(batches, out, passes=args.passes, shuffle=args.shuffle, warmup=args.warmup)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
