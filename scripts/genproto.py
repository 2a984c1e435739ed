"""Regenerate the committed gRPC stubs from proto/ (``make proto``).

Writes ``halcyon/v1/*_pb2.py``, ``*_pb2.pyi``, ``*_pb2_grpc.py`` and ``*_pb2_grpc.pyi`` under
OUT (default: the repository root), and the same for the vendored Open Inference Protocol
(``proto/vendor/halcyon/oip/grpc_predict_v2.proto``, package ``inference``) into
``halcyon/oip/``. The stale-stub test runs this into a temporary directory
and compares the result byte for byte with what is committed, so the pinned grpcio-tools and
mypy-protobuf versions in pyproject.toml are part of the contract.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
VENDOR_ROOT = PROTO_ROOT / "vendor"  # third-party protocols, outside buf lint (buf.yaml)
# (include root, glob under it, generated package, its __init__ docstring)
PACKAGES = (
    (PROTO_ROOT, "halcyon/v1/*.proto", "halcyon/v1", "Generated gRPC stubs for halcyon.v1"),
    (
        VENDOR_ROOT,
        "halcyon/oip/*.proto",
        "halcyon/oip",
        "Generated stubs for the Open Inference Protocol (KServe v2 gRPC, package inference)",
    ),
)


def generate(out: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency: imported here so --help works without it

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    plugin = shutil.which("protoc-gen-mypy_grpc", path=str(Path(sys.executable).parent))
    if plugin is None:
        raise SystemExit("protoc-gen-mypy_grpc not found next to python: pip install -e '.[dev]'")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for root, pattern, package, doc in PACKAGES:
        protos = sorted(root.glob(pattern))
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            f"--plugin=protoc-gen-mypy_grpc={plugin}",
            f"--mypy_grpc_out={out}",
            *[str(p.relative_to(root)) for p in protos],
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        pkg = out / package
        init = pkg / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{doc} (make proto)."""\n')
        written += sorted(pkg.iterdir())
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo root)")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
