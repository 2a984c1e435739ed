"""``halcyon model …``: make the ONNX model that ``halcyon worker --runtime onnx`` serves.

``halcyon model generate`` writes a small random-weight byte-level decoder (see
:mod:`worker.onnx_model`) from a seed — no download — and prints where it wrote it and the
model contract the worker checks (``docs/reference/onnx-model-contract.md``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["configure", "run"]

_EPILOG = """\
examples:
  halcyon model generate                           # the large preset, into the cache dir
  halcyon model generate --out model.onnx --preset small --seed 7
  halcyon worker --dev-mode --runtime onnx --model-file model.onnx

presets: small = 2 layers, d_model 128; large = 4 layers, d_model 256 (both 4 heads,
1024 positions of context, 256 byte values). The same preset and seed always give a
byte-identical file. Without --out the model goes to $HALCYON_CACHE_DIR/models/ or
~/.cache/halcyon/models/ as <preset>-<seed>.onnx, where the stack looks for it.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Generate the ONNX model an in-process ONNX Runtime worker serves: a small byte-level "
        "decoder with a KV cache and random weights from a seed."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    generate = sub.add_parser(
        "generate",
        help="write a seeded byte-level decoder as ONNX and print its contract",
        description="Write a seeded byte-level decoder as an ONNX file and print its contract.",
        epilog=_EPILOG,
        formatter_class=parser.formatter_class,
    )
    generate.add_argument(
        "--out",
        type=Path,
        metavar="PATH",
        help="where to write it (default: the cache, <cache>/models/<preset>-<seed>.onnx)",
    )
    generate.add_argument(
        "--preset",
        choices=["small", "large"],
        default="large",
        help="model size (default %(default)s)",
    )
    generate.add_argument(
        "--seed", type=int, default=0, help="seed of the random weights (default %(default)s)"
    )
    generate.add_argument(
        "--force",
        action="store_true",
        help="overwrite an existing file (without it an existing --out is refused and the "
        "cached model, named by preset and seed, is reused)",
    )


def run(args: argparse.Namespace) -> int:
    from worker.onnx_engine import DecoderEngine, ModelContractError
    from worker.onnx_model import default_model_path, generate_preset

    prog = "halcyon model generate"
    target: Path = args.out if args.out is not None else default_model_path(args.preset, args.seed)
    if target.is_dir():
        print(f"{prog}: {target} is a directory; give a file path for --out", file=sys.stderr)
        return 1
    if target.exists() and not args.force and args.out is not None:
        print(f"{prog}: {target} exists; pass --force to overwrite it", file=sys.stderr)
        return 1
    if target.exists() and not args.force:
        verb = "reused cached"
    else:
        generate_preset(target, args.preset, args.seed)
        verb = "wrote"
    try:
        engine = DecoderEngine(str(target))  # checks what the worker will check
    except ModelContractError as exc:
        print(f"{prog}: {exc}; pass --force to regenerate it", file=sys.stderr)
        return 1
    size_mb = target.stat().st_size / 1e6
    print(f"{verb} {target} ({size_mb:.1f} MB, preset {args.preset}, seed {args.seed})")
    print(f"contract: {engine.contract}")
    print(f"serve it: halcyon worker --dev-mode --runtime onnx --model-file {target}")
    return 0
