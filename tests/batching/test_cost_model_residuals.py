"""``scripts/cost_model_residuals.py``: both forms' online residuals on measured batches."""

from __future__ import annotations

import csv
import importlib.util
import io
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cost_model_residuals.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cost_model_residuals", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _write_decoder_batches(path: Path, step_s: float, n: int = 400) -> None:
    """Batches of a synthetic decoder: 5 ms + 0.02 ms/token + ``step_s`` per decode step."""
    rng = random.Random(9)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["items", "batch_tokens", "longest_output", "seconds"])
        for _ in range(n):
            items = rng.choice([1, 2, 4, 8, 16])
            outputs = [rng.randint(1, 256) for _ in range(items)]
            tokens = sum(outputs) + sum(rng.randint(8, 256) for _ in range(items))
            seconds = (0.005 + 0.00002 * tokens + step_s * max(outputs)) * rng.uniform(0.97, 1.03)
            writer.writerow([items, tokens, max(outputs), f"{seconds:.6f}"])


def test_three_term_form_fits_a_decoder_the_two_term_form_cannot(tmp_path: Path) -> None:
    module = _script()
    path = tmp_path / "batches.csv"
    _write_decoder_batches(path, step_s=0.0004)
    out = io.StringIO()
    assert module.main([str(path), "--warmup", "50"], out) == 0
    two, three = module.report(module.read_batches(path), io.StringIO(), warmup=50)[""]
    assert (two.form, three.form) == ("2-term", "3-term")
    assert two.batches == three.batches == 350
    assert three.rms_relative < 0.05 < two.rms_relative
    assert three.step_s == pytest.approx(0.0004, rel=0.1)
    assert two.step_s == 0.0
    text = out.getvalue()
    assert "| - | 2-term | 350 |" in text and "| - | 3-term | 350 |" in text


def test_without_a_decode_cost_both_forms_agree(tmp_path: Path) -> None:
    module = _script()
    path = tmp_path / "batches.csv"
    _write_decoder_batches(path, step_s=0.0)
    two, three = module.report(module.read_batches(path), io.StringIO(), warmup=50)[""]
    assert two.rms_relative < 0.05 and three.rms_relative < 0.05
    assert three.rms_relative == pytest.approx(two.rms_relative, abs=0.01)


def test_reads_the_onnx_cost_curve_grid_per_preset(tmp_path: Path) -> None:
    module = _script()
    path = tmp_path / "onnx-cost-curve.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["preset", "batch", "output_tokens", "prompt_bytes", "threads", "seconds"])
        for preset, step in (("small", 0.0001), ("large", 0.0008)):
            for batch in (1, 2, 4, 8):
                for output in (16, 64, 256):
                    seconds = 0.001 + 0.00001 * batch * (8 + output) + step * output
                    writer.writerow([preset, batch, output, 32, 1, seconds])
    batches = module.read_batches(path)
    assert batches[0] == module.MeasuredBatch(1, 1 * (8 + 16), 16, pytest.approx(0.00284), "small")
    out = io.StringIO()
    results = module.report(batches, out, passes=20, shuffle=1, warmup=120)
    assert set(results) == {"small", "large"}
    for name, step in (("small", 0.0001), ("large", 0.0008)):
        two, three = results[name]
        assert three.rms_relative < two.rms_relative
        assert three.step_s == pytest.approx(step, rel=0.1)
    assert "| large | 3-term |" in out.getvalue()


def test_refuses_a_csv_without_the_columns(tmp_path: Path) -> None:
    module = _script()
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="expected columns"):
        module.read_batches(path)
