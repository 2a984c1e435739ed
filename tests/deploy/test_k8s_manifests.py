"""The Kubernetes overlays cannot drift from the code.

Every overlay is rendered with ``kubectl kustomize`` and every object validated strictly
against the oldest and the newest Kubernetes schema ``kubernetes-validate`` ships. Then the
dev and prod workloads run as real local processes exactly as their manifests say
(``k8s_local``), are probed as the kubelet probes them, serve an Infer with the dev overlay's
demo tenant key, and stop within their termination grace after their preStop hook. A flag
renamed in the code, a probe on the wrong port or name, a Secret key the manifests read but do
not provide, a grace period shorter than the drain: each fails here.
"""

from __future__ import annotations

import subprocess
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate
import pytest
import yaml
from deploy_support import DEPLOY, free_port, require_tool  # type: ignore[import-not-found]
from k8s_local import WORKLOADS, LocalCluster, Objects, entrypoint  # type: ignore[import-not-found]

from halcyon.v1 import infer_pb2, infer_pb2_grpc

K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "prod", "monitoring")
RUNNABLE = ("dev", "prod")
DEMO_KEY = "halcyon-dev-demo-key"  # its digest is in overlays/dev/tenants.yaml
# Custom resources the schemas do not cover; checked by hand below.
CUSTOM_KINDS = {"ServiceMonitor"}
# Oldest and newest Kubernetes versions kubernetes-validate knows.
KUBERNETES_VERSIONS = sorted(
    set(kubernetes_validate.utils.all_versions()),
    key=lambda v: tuple(int(x) for x in v.split(".")),
)[:: len(set(kubernetes_validate.utils.all_versions())) - 1]

Doc = dict[str, Any]


@cache
def render(overlay: str) -> tuple[Doc, ...]:
    kubectl = require_tool("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def workloads(overlay: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in render(overlay) if d["kind"] in WORKLOADS}


def of_kind(overlay: str, kind: str) -> list[Doc]:
    return [d for d in render(overlay) if d["kind"] == kind]


def container(workload: Doc) -> Doc:
    [c] = workload["spec"]["template"]["spec"]["containers"]
    return dict(c)


def flag(c: Doc, name: str) -> str | None:
    for arg in c.get("args", []):
        if arg.startswith(f"--{name}="):
            return str(arg.split("=", 1)[1])
    return None


# -- schema ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly(overlay: str, version: str) -> None:
    for doc in render(overlay):
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']} on {version}: {err}")


def test_the_service_monitor_scrapes_every_metrics_port() -> None:
    [monitor] = of_kind("monitoring", "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    scraped = {
        s["metadata"]["name"]
        for s in of_kind("monitoring", "Service")
        if all(s["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())
        and ports & {p.get("name") for p in s["spec"]["ports"]}
    }
    assert scraped == {"halcyon-controller", "halcyon-gateway", "halcyon-worker"}


# -- what the issue asks of every pod --------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_restricted_probed_drained_and_sized(overlay: str) -> None:
    found = workloads(overlay)
    assert set(found) == {"halcyon-controller", "halcyon-gateway", "halcyon-worker"}
    for name, workload in found.items():
        pod = workload["spec"]["template"]
        spec, c = pod["spec"], container(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, name
        assert c["livenessProbe"]["grpc"]["service"] == "liveness", name
        assert c["readinessProbe"]["grpc"]["service"] == "readiness", name
        for key in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][key]), (name, key)
        annotations = pod["metadata"]["annotations"]
        metrics_port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(metrics_port), name
        # The kubelet's grace must cover the preStop hook and the server's whole drain: the
        # drain delay (readiness off, still serving), then up to twice --shutdown-grace
        # (accepted work, then the server's stop).
        pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep", name
        shutdown_grace = float(flag(c, "shutdown-grace") or 10)
        drain_delay = float(flag(c, "drain-delay") or 5)
        assert spec["terminationGracePeriodSeconds"] >= (
            float(pre_stop[1]) + drain_delay + 2 * shutdown_grace
        ), name
        # Probes go to the probe port, answered off the event loop (ADR 0010).
        health_port = {p["name"]: p["containerPort"] for p in c["ports"]}["health"]
        assert flag(c, "health-listen") == f"0.0.0.0:{health_port}", name
        for kind in ("livenessProbe", "readinessProbe"):
            assert c[kind]["grpc"]["port"] == health_port, (name, kind)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_credentials_come_from_secrets_in_env_never_args(overlay: str) -> None:
    for name, workload in workloads(overlay).items():
        c = container(workload)
        for arg in c.get("args", []):
            assert "token" not in arg.split("=", 1)[0], f"{name}: credential in args: {arg}"
        env = {e["name"]: e for e in c.get("env", [])}
        assert "secretKeyRef" in env["HALCYON_FLEET_TOKEN"]["valueFrom"], name
        if name != "halcyon-gateway":  # the gateway checks no operator credential
            assert "secretKeyRef" in env["HALCYON_OPERATOR_TOKEN"]["valueFrom"], name


def test_prod_contains_no_secret_and_dev_generates_them() -> None:
    assert of_kind("prod", "Secret") == [] and of_kind("monitoring", "Secret") == []
    dev = {s["metadata"]["name"].rsplit("-", 1)[0] for s in of_kind("dev", "Secret")}
    assert dev == {"halcyon-credentials", "halcyon-tenants"}


def test_dev_runs_one_of_each_with_small_requests() -> None:
    for name, workload in workloads("dev").items():
        assert workload["spec"].get("replicas", 1) == 1, name
        requests = container(workload)["resources"]["requests"]
        assert requests["cpu"].endswith("m") and int(requests["cpu"][:-1]) <= 100, name


def test_prod_scales_gateways_and_puts_workers_on_gpus_behind_network_policies() -> None:
    [hpa] = of_kind("prod", "HorizontalPodAutoscaler")
    [pdb] = of_kind("prod", "PodDisruptionBudget")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "halcyon-gateway"
    assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "halcyon-gateway"}
    worker = workloads("prod")["halcyon-worker"]
    assert worker["kind"] == "StatefulSet"
    spec = worker["spec"]["template"]["spec"]
    assert container(worker)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] and spec["tolerations"]

    policies = {p["metadata"]["name"]: p["spec"] for p in of_kind("prod", "NetworkPolicy")}
    assert policies["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}

    def sources(policy: str, port: str) -> list[Doc]:
        return [
            peer
            for rule in policies[policy]["ingress"]
            if port in {p["port"] for p in rule.get("ports", [])}
            for peer in rule.get("from", [{}])
        ]

    gateway = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "halcyon-gateway"}}}
    assert sources("halcyon-worker", "grpc") == [gateway]
    operators = [p for p in sources("halcyon-controller", "grpc") if "namespaceSelector" in p]
    assert operators == [
        {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {"halcyon.dev/operator": "true"}},
        }
    ]


# -- the manifests, run ----------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.timeout(180)
@pytest.mark.parametrize("overlay", RUNNABLE)
def test_workloads_run_as_declared_probe_healthy_serve_and_drain(
    overlay: str, tmp_path: Path
) -> None:
    # Secrets the overlay expects to exist come from the dev overlay (prod contains none).
    provided = Objects()
    provided.add(of_kind("dev", "Secret"))
    cluster = LocalCluster(
        list(render(overlay)), provided, tmp_path, entrypoint(DEPLOY / "Dockerfile"), free_port
    )
    try:
        cluster.start()
        cluster.wait_probes(timeout_s=45.0)
        for pod in cluster.pods:
            # The address the scrape annotation names serves Prometheus text.
            port = int(
                pod.workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
            )
            with urllib.request.urlopen(f"http://{pod.local(port)}/metrics", timeout=5) as resp:
                assert b"process_cpu_seconds_total" in resp.read(), pod.name
        # A client of the gateway Service with the demo tenant's key gets an answer.
        with grpc.insecure_channel(cluster.service("halcyon-gateway", 50051)) as channel:
            reply = infer_pb2_grpc.InferServiceStub(channel).Infer(
                infer_pb2.InferRequest(model="llama-3-8b", input="hello", max_output_tokens=8),
                metadata=(("x-api-key", DEMO_KEY),),
                timeout=10,
            )
        assert reply.output and reply.version == "v1"
        assert reply.replica_id == "halcyon-worker-0"  # --replica-id=$(POD_NAME)
        stopped = cluster.terminate()
        for name, (code, took, grace) in stopped.items():
            assert code == 0, f"{name}: exit {code} {took:.1f} s into a {grace:g} s grace\n" + (
                cluster.describe()
            )
    finally:
        cluster.close()
