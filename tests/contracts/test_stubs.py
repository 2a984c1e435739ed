"""The committed stubs are what `make proto` would generate now, and they import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "genproto.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    # halcyon/v1 from proto/halcyon/v1; halcyon/oip from the vendored proto/vendor/halcyon/oip.
    for package in ("v1", "oip"):
        fresh = {p.name: p.read_bytes() for p in (tmp_path / "halcyon" / package).iterdir()}
        committed_dir = ROOT / "halcyon" / package
        stale = [
            name
            for name, content in fresh.items()
            if not (committed_dir / name).exists() or (committed_dir / name).read_bytes() != content
        ]
        assert not stale, f"stubs are stale relative to proto/: {stale}; run `make proto`"
        generated = {p.name for p in committed_dir.glob("*_pb2*")}
        orphans = generated - set(fresh)
        assert not orphans, f"committed stubs with no proto: {sorted(orphans)}"


def test_stubs_import_and_describe_services() -> None:
    from halcyon.v1 import control_pb2, infer_pb2, worker_pb2

    services = {
        infer_pb2.DESCRIPTOR.services_by_name["InferService"].full_name,
        worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
        control_pb2.DESCRIPTOR.services_by_name["ControlService"].full_name,
    }
    assert services == {
        "halcyon.v1.InferService",
        "halcyon.v1.WorkerService",
        "halcyon.v1.ControlService",
    }


def test_vendored_oip_stubs_keep_the_protocol_names() -> None:
    # The wire names are the Open Inference Protocol's (package inference), whatever the path.
    from halcyon.oip import grpc_predict_v2_pb2

    service = grpc_predict_v2_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == "inference.GRPCInferenceService"
    assert {"ServerReady", "ModelReady", "ModelMetadata", "ModelInfer"} <= {
        m.name for m in service.methods
    }


def test_every_enum_starts_with_unspecified_zero() -> None:
    from halcyon.v1 import control_pb2, infer_pb2

    for module in (infer_pb2, control_pb2):
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            assert enum.values[0].number == 0
            assert enum.values[0].name.endswith("_UNSPECIFIED"), enum.full_name
