"""Seconds per batch of the generated ONNX decoder, by batch size and output length.

For each preset (``small``, ``large``) generates the model into a temporary directory, then
times ``DecoderEngine.generate`` (1 ONNX Runtime thread unless ``--threads``) for every batch
size × output length, with prompts of ``--prompt-bytes`` bytes, keeping the median of
``--runs`` runs. Prints a table, writes ``docs/img/onnx-cost-curve.csv`` and draws
``docs/img/onnx-cost-curve.png`` (seconds vs batch size, one line per output length, with the
two fitted cost forms dashed and dotted), and reports how well each form fits:

* form A: ``a + b × Σ(input + output tokens)`` — the simulated device's shape;
* form B: ``a + b × Σ tokens + c × longest_output + d × batch_size × longest_output``;
* form C (for reference): form B ``+ e × batch_size × longest_output²`` — the attention and
  KV-cache traffic of a step grows with the cache length, so a batch's total has a quadratic
  term in its output length.

Both are fitted by least squares on the relative residual (each row divided by its measured
time), and the RMS relative residual of each is printed.

    .venv/bin/python scripts/onnx_cost_curve.py
    .venv/bin/python scripts/onnx_cost_curve.py --presets small --batches 1,4 --outputs 16,64
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import numpy.typing as npt

from worker.onnx_engine import DecoderEngine
from worker.onnx_model import PRESETS, generate_preset

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Point:
    preset: str
    batch: int
    output_tokens: int
    prompt_bytes: int
    seconds: float  # wall time of the generate call
    cpu_seconds: float  # process CPU time over the call (less disturbed by other load)

    @property
    def work_tokens(self) -> int:
        return self.batch * (self.prompt_bytes + self.output_tokens)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("need positive integers")
    return values


def _prompts(batch: int, size: int, rng: np.random.Generator) -> list[bytes]:
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
    return [bytes(rng.choice(alphabet, size=size).tolist()) for _ in range(batch)]


def measure(
    engine: DecoderEngine,
    preset: str,
    batches: list[int],
    outputs: list[int],
    prompt_bytes: int,
    runs: int,
) -> list[Point]:
    """Median wall and CPU seconds per cell; the runs are interleaved (run 1 of every cell,
    then run 2 ...) so a burst of load from elsewhere does not land on all runs of one cell."""
    rng = np.random.default_rng(0)
    engine.generate(_prompts(4, prompt_bytes, rng), [16] * 4)  # warm ORT up
    cells = [(batch, out) for out in outputs for batch in batches]
    wall: dict[tuple[int, int], list[float]] = {cell: [] for cell in cells}
    cpu: dict[tuple[int, int], list[float]] = {cell: [] for cell in cells}
    for run in range(runs):
        for batch, out in cells:
            prompts = _prompts(batch, prompt_bytes, rng)
            cpu0, started = time.process_time(), time.perf_counter()
            engine.generate(prompts, [out] * batch)
            wall[(batch, out)].append(time.perf_counter() - started)
            cpu[(batch, out)].append(time.process_time() - cpu0)
        print(f"  {preset}: run {run + 1} of {runs} done", file=sys.stderr, flush=True)
    return [
        Point(
            preset,
            batch,
            out,
            prompt_bytes,
            statistics.median(wall[(batch, out)]),
            statistics.median(cpu[(batch, out)]),
        )
        for batch, out in cells
    ]


def _features(points: list[Point], form: str) -> npt.NDArray[np.float64]:
    rows = []
    for p in points:
        row = [1.0, float(p.work_tokens)]
        if form in ("B", "C"):
            row += [float(p.output_tokens), float(p.batch * p.output_tokens)]
        if form == "C":
            row.append(float(p.batch * p.output_tokens**2))
        rows.append(row)
    return np.array(rows, dtype=np.float64)


def fit(
    points: list[Point], form: str, *, cpu: bool = False
) -> tuple[npt.NDArray[np.float64], float]:
    """Coefficients minimising the RMS relative residual, and that residual."""
    x = _features(points, form)
    y = np.array([p.cpu_seconds if cpu else p.seconds for p in points], dtype=np.float64)
    solution = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)[0]
    coef = np.asarray(solution, dtype=np.float64)
    rel = (x @ coef - y) / y
    return coef, float(np.sqrt(np.mean(rel**2)))


def _table(
    points: list[Point], batches: list[int], outputs: list[int], *, cpu: bool = False
) -> str:
    lines = []
    what = "CPU seconds" if cpu else "seconds"
    for preset in dict.fromkeys(p.preset for p in points):
        by = {
            (p.batch, p.output_tokens): p.cpu_seconds if cpu else p.seconds
            for p in points
            if p.preset == preset
        }
        lines.append(f"{preset}: {what} per batch (rows: output tokens; columns: batch size)")
        lines.append("  out \\ B " + "".join(f"{b:>9d}" for b in batches))
        for out in outputs:
            cells = "".join(f"{by[(b, out)]:9.4f}" for b in batches)
            lines.append(f"  {out:7d} " + cells)
    return "\n".join(lines)


def _plot(
    points: list[Point],
    fits: dict[tuple[str, str], npt.NDArray[np.float64]],
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(dict.fromkeys(p.preset for p in points))
    fig, axes = plt.subplots(1, len(presets), figsize=(6.5 * len(presets), 5), squeeze=False)
    for ax, preset in zip(axes[0], presets, strict=True):
        mine = [p for p in points if p.preset == preset]
        for i, out in enumerate(sorted({p.output_tokens for p in mine})):
            line = sorted((p for p in mine if p.output_tokens == out), key=lambda p: p.batch)
            color = f"C{i}"
            xs = [p.batch for p in line]
            ax.plot(xs, [p.seconds for p in line], "o-", color=color, label=f"{out} out")
            for form, style in (("A", "--"), ("B", ":")):
                pred = _features(line, form) @ fits[(preset, form)]
                ax.plot(xs, pred, style, color=color, linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size (items)")
        ax.set_ylabel("seconds per batch")
        ax.set_title(
            f"{preset} ({PRESETS[preset].layers} layers, d {PRESETS[preset].d_model}); "
            "-- form A, : form B"
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _read_csv(path: Path, presets: list[str]) -> list[Point]:
    with path.open(newline="") as f:
        return [
            Point(
                row["preset"],
                int(row["batch"]),
                int(row["output_tokens"]),
                int(row["prompt_bytes"]),
                float(row["seconds"]),
                float(row.get("cpu_seconds") or row["seconds"]),
            )
            for row in csv.DictReader(f)
            if row["preset"] in presets
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="small,large", help="default %(default)s")
    parser.add_argument("--batches", type=_ints, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--outputs", type=_ints, default=[16, 32, 64, 128, 256])
    parser.add_argument("--prompt-bytes", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument(
        "--from-csv", type=Path, help="refit and replot a CSV this script wrote; measure nothing"
    )
    args = parser.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    if args.from_csv is not None:
        points = _read_csv(args.from_csv, presets)
        args.batches = sorted({p.batch for p in points})
        args.outputs = sorted({p.output_tokens for p in points})
    else:
        points = []
        with tempfile.TemporaryDirectory() as tmp:
            for preset in presets:
                model = generate_preset(Path(tmp) / f"{preset}.onnx", preset)
                engine = DecoderEngine(str(model), threads=args.threads)
                points += measure(
                    engine, preset, args.batches, args.outputs, args.prompt_bytes, args.runs
                )
    print(_table(points, args.batches, args.outputs))
    print(_table(points, args.batches, args.outputs, cpu=True))
    fits: dict[tuple[str, str], npt.NDArray[np.float64]] = {}
    names = ["a", "b·Σtok", "c·longest", "d·B×longest", "e·B×longest²"]
    for cpu in (False, True):
        print("fits to CPU seconds:" if cpu else "fits to wall seconds:")
        for preset in presets:
            mine = [p for p in points if p.preset == preset]
            for form in ("A", "B", "C"):
                coef, rms = fit(mine, form, cpu=cpu)
                if not cpu:
                    fits[(preset, form)] = coef
                terms = ", ".join(
                    f"{n}={c * 1000:.4g} ms" for n, c in zip(names, coef, strict=False)
                )
                print(f"  {preset} form {form}: RMS relative residual {rms * 100:.1f}%  ({terms})")
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "onnx-cost-curve.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "preset",
                "batch",
                "output_tokens",
                "prompt_bytes",
                "threads",
                "seconds",
                "cpu_seconds",
            ]
        )
        for p in points:
            writer.writerow(
                [
                    p.preset,
                    p.batch,
                    p.output_tokens,
                    p.prompt_bytes,
                    args.threads,
                    f"{p.seconds:.6f}",
                    f"{p.cpu_seconds:.6f}",
                ]
            )
    _plot(points, fits, out_dir / "onnx-cost-curve.png")
    print(f"wrote {out_dir / 'onnx-cost-curve.csv'} and {out_dir / 'onnx-cost-curve.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
