"""The Kubernetes manifests render with kustomize and validate against the API schema offline."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30"


def _documents() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl:
        rendered = subprocess.run(
            [kubectl, "kustomize", str(K8S)], check=True, capture_output=True, text=True
        ).stdout
        return [d for d in yaml.safe_load_all(rendered) if d]
    # Without kubectl, validate the resources kustomize would include, as written.
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def test_every_manifest_validates_strictly() -> None:
    docs = _documents()
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "StatefulSet", "Service", "Secret"} <= kinds
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", ["halcyon-gateway", "halcyon-worker", "halcyon-controller"])
def test_probes_use_separate_grpc_health_names(name: str) -> None:
    workload = next(
        d
        for d in _documents()
        if d["kind"] in {"Deployment", "StatefulSet"} and d["metadata"]["name"] == name
    )
    container = workload["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["grpc"]["service"] == "liveness"
    assert container["readinessProbe"]["grpc"]["service"] == "readiness"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
