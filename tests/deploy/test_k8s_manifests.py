"""The Kubernetes overlays cannot drift from the code.

Every overlay is rendered with ``kubectl kustomize`` and every object validated strictly
against the oldest and the newest Kubernetes schema ``kubernetes-validate`` ships (the
Prometheus Operator's ServiceMonitor and PrometheusRule, which no schema covers, are checked
by hand; the PrometheusRule must be what scripts/render_prometheus_rule.py makes of the
current deploy/prometheus/rules.yml). Every container's arguments parse with the
subcommand's real flags. Then the dev workloads run as real local processes exactly as their
manifests say (``k8s_local``), are probed as the kubelet probes them, serve an Infer with the
dev overlay's demo tenant key, and stop within their termination grace after their preStop
hook (prod is not run: its controllers need a PostgreSQL; its shape is checked instead). A
flag renamed in the code, a probe on the wrong port or name, a Secret key the manifests read
but do not provide, a grace period shorter than the drain: each fails here.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
import urllib.request
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from deploy_support import DEPLOY, REPO, free_port, require_tool  # type: ignore[import-not-found]
from grpc_health.v1 import health_pb2
from k8s_local import WORKLOADS, LocalCluster, Objects, entrypoint  # type: ignore[import-not-found]

from bench.command_frame import subcommand_parser
from halcyon.tools.cli import SUBCOMMANDS
from halcyon.v1 import infer_pb2, infer_pb2_grpc

K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "prod", "monitoring")
# Prod's controllers need a PostgreSQL, which these tests do not run.
RUNNABLE = ("dev",)
DEMO_KEY = "halcyon-dev-demo-key"  # its digest is in overlays/dev/tenants.yaml
# Custom resources the schemas do not cover; checked by hand below.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
RULES = DEPLOY / "prometheus" / "rules.yml"
RENDER_SCRIPT = REPO / "scripts" / "render_prometheus_rule.py"
STORE_SECRET_EXAMPLE = K8S / "overlays" / "prod" / "store-secret.example.yaml"
# What the downward API gives a pod, for expanding $(VAR) in its arguments.
FIELD_VALUES = {"status.podIP": "10.0.0.7", "metadata.name": "pod-0", "metadata.namespace": "ns"}
# The longest a worker's model may take to load before the kubelet restarts the container
# (the startup probe's failureThreshold x periodSeconds; docs/reference/operations.md).
WORKER_STARTUP_BUDGET_S = 300
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


def pods_selected(overlay: str, match_labels: dict[str, str]) -> set[str]:
    """The workloads whose pod template carries every label of ``match_labels``."""
    return {
        name
        for name, w in workloads(overlay).items()
        if match_labels.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    }


def render_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_prometheus_rule", RENDER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def env_refs(c: Doc) -> dict[str, Doc]:
    """Each env var of the container -> its ``valueFrom`` (empty for a literal value)."""
    return {e["name"]: e.get("valueFrom", {}) for e in c.get("env", [])}


def expand(text: str, values: dict[str, str]) -> str:
    """``$(VAR)`` references replaced as the kubelet does (an unknown one is left as written)."""
    return re.sub(r"\$\(([A-Za-z_]\w*)\)", lambda m: values.get(m[1], m[0]), text)


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


def test_the_prometheus_rule_is_the_rule_file_rendered_now() -> None:
    # Read at test time: deploy/prometheus/rules.yml changes (metric renames), and the
    # committed PrometheusRule must follow it.
    script = render_script()
    committed = script.OUT.read_text()
    assert committed == script.render(RULES.read_text()), (
        f"{script.OUT.relative_to(REPO)} is stale: run "
        f".venv/bin/python {RENDER_SCRIPT.relative_to(REPO)}"
    )
    [rule] = of_kind("monitoring", "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    # By hand, what the operator's CRD requires of each rule.
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"], group
        for r in group["rules"]:
            assert len({"record", "alert"} & set(r)) == 1 and isinstance(r["expr"], str), r
            assert set(r) <= {"record", "alert", "expr", "for", "labels", "annotations"}, r
    # Where the ServiceMonitor and the workloads are, and only in the monitoring overlay.
    [monitor] = of_kind("monitoring", "ServiceMonitor")
    assert rule["metadata"]["namespace"] == monitor["metadata"]["namespace"] == "halcyon"
    assert {w["metadata"]["namespace"] for w in workloads("monitoring").values()} == {"halcyon"}
    assert of_kind("prod", "PrometheusRule") == [] and of_kind("dev", "PrometheusRule") == []


def test_the_prometheus_rule_render_refuses_what_it_cannot_carry_verbatim() -> None:
    script = render_script()
    with pytest.raises(script.RenderError):
        script.render("groups: []\nextra: 1\n")
    # A document marker would change meaning once indented: the render checks itself.
    with pytest.raises(script.RenderError):
        script.render(
            "groups:\n  - name: a\n    rules:\n      - record: x\n        expr: |\n"
            "          up\n\n...\n"
        )


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
        # prod's (and monitoring's) two controllers are Ready while live: a standby redirects.
        two_controllers = overlay != "dev" and name == "halcyon-controller"
        ready_name = "liveness" if two_controllers else "readiness"
        assert c["readinessProbe"]["grpc"]["service"] == ready_name, name
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
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert c[kind]["grpc"]["port"] == health_port, (name, kind)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_probed_container_has_a_startup_probe_sized_for_its_start(overlay: str) -> None:
    for name, workload in workloads(overlay).items():
        for c in workload["spec"]["template"]["spec"]["containers"]:
            if "readinessProbe" not in c:
                continue
            startup = c.get("startupProbe")
            assert startup, f"{overlay}: {name}/{c['name']} has readiness but no startupProbe"
            # On liveness: it must pass once the process serves, whether or not it is ready
            # (a gateway is not ready until a worker registers; restarting it would not help).
            assert startup["grpc"]["service"] == "liveness", (name, startup)
            budget = startup["failureThreshold"] * startup["periodSeconds"]
            live = c["livenessProbe"]
            assert budget >= live["failureThreshold"] * live["periodSeconds"], (name, budget)
            if name == "halcyon-worker":  # a model load (or --runtime oip's backend) is slow
                assert budget >= WORKER_STARTUP_BUDGET_S, (name, budget)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_have_a_disruption_budget_and_spread_over_nodes_and_zones(overlay: str) -> None:
    budgets = {p["metadata"]["name"]: p["spec"] for p in of_kind(overlay, "PodDisruptionBudget")}
    worker_budget = budgets["halcyon-worker"]
    assert pods_selected(overlay, worker_budget["selector"]["matchLabels"]) == {"halcyon-worker"}
    assert worker_budget["maxUnavailable"] == 1 and "minAvailable" not in worker_budget
    # Every budget selects the pods of exactly one workload.
    for name, budget in budgets.items():
        assert pods_selected(overlay, budget["selector"]["matchLabels"]) == {name}, name

    spec = workloads(overlay)["halcyon-worker"]["spec"]["template"]["spec"]
    spread = {t["topologyKey"]: t for t in spec["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert spread["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"
    for key, constraint in spread.items():
        assert constraint["maxSkew"] == 1, key
        selected = pods_selected(overlay, constraint["labelSelector"]["matchLabels"])
        assert selected == {"halcyon-worker"}, key


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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_s_arguments_parse_with_the_real_flags(overlay: str) -> None:
    # Prod is not run (see RUNNABLE): this is what catches a flag renamed in the code there.
    for name, workload in workloads(overlay).items():
        c = container(workload)
        values = {
            var: FIELD_VALUES[ref["fieldRef"]["fieldPath"]]
            for var, ref in env_refs(c).items()
            if "fieldRef" in ref
        }
        args = [expand(a, values) for a in c["args"]]
        command, rest = args[0], args[1:]
        module_name, help_text = SUBCOMMANDS[command]
        parser = subcommand_parser(command, importlib.import_module(module_name), help_text)
        try:
            parser.parse_args(rest)
        except SystemExit as exc:
            pytest.fail(f"{overlay}: {name}: halcyon {' '.join(args)} does not parse ({exc})")


def test_dev_keeps_one_controller_on_sqlite_on_its_own_volume() -> None:
    controller = workloads("dev")["halcyon-controller"]
    spec, c = controller["spec"]["template"]["spec"], container(controller)
    assert controller["spec"]["replicas"] == 1
    # The old pod lets go of the ReadWriteOnce volume before the new one starts.
    assert controller["spec"]["strategy"] == {"type": "Recreate"}
    db = flag(c, "db")
    assert db is not None and "HALCYON_STORE" not in env_refs(c)
    [mount] = [m for m in c["volumeMounts"] if db.startswith(m["mountPath"] + "/")]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    claims = {p["metadata"]["name"]: p for p in of_kind("dev", "PersistentVolumeClaim")}
    claim = claims[volume["persistentVolumeClaim"]["claimName"]]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_prod_runs_two_gateways_and_two_controllers_against_postgresql_from_a_secret() -> None:
    found = workloads("prod")
    gateway, controller = found["halcyon-gateway"], found["halcyon-controller"]
    [hpa] = of_kind("prod", "HorizontalPodAutoscaler")
    # Before its first quota lease a gateway admits 1/N of a fleet contract: N is the count.
    assert gateway["spec"]["replicas"] == hpa["spec"]["minReplicas"] == 2
    assert flag(container(gateway), "expected-gateways") == "2"

    assert controller["kind"] == "Deployment" and controller["spec"]["replicas"] == 2
    assert controller["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    spec, c = controller["spec"]["template"]["spec"], container(controller)
    # The state is in the database: no claim, no volume but the scratch /tmp.
    assert of_kind("prod", "PersistentVolumeClaim") == []
    assert "volumeClaimTemplates" not in controller["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["tmp"] and "emptyDir" in spec["volumes"][0]
    assert flag(c, "db") is None and flag(c, "store") is None
    env = env_refs(c)
    assert env["HALCYON_STORE"]["secretKeyRef"] == {"name": "halcyon-store", "key": "url"}
    assert env["PGPASSWORD"]["secretKeyRef"] == {"name": "halcyon-store", "key": "password"}
    # The leader publishes the pod's own address. Both controllers are Ready while live (a
    # standby redirects with NOT_LEADER), or a rolling update with maxUnavailable 0 and the
    # disruption budget could never let the leader go.
    assert flag(c, "advertise") == "$(POD_IP):50050"
    assert env["POD_IP"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert c["readinessProbe"]["grpc"]["service"] == "liveness"
    [service] = [
        s for s in of_kind("prod", "Service") if s["metadata"]["name"] == "halcyon-controller"
    ]
    assert not service["spec"].get("publishNotReadyAddresses", False)
    assert pods_selected("prod", service["spec"]["selector"]) == {"halcyon-controller"}
    # The two prefer different nodes.
    [term] = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selected = pods_selected("prod", term["podAffinityTerm"]["labelSelector"]["matchLabels"])
    assert selected == {"halcyon-controller"}

    budgets = {p["metadata"]["name"]: p["spec"] for p in of_kind("prod", "PodDisruptionBudget")}
    assert budgets["halcyon-controller"]["minAvailable"] == 1
    assert budgets["halcyon-gateway"].get("minAvailable", 1) >= 1
    assert budgets["halcyon-gateway"].get("maxUnavailable", 1) <= 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_password_looking_value_on_any_command_line(overlay: str) -> None:
    looks_secret = re.compile(r"pass(word)?|secret|://[^/@:]+:[^/@]+@", re.IGNORECASE)
    for name, workload in workloads(overlay).items():
        c = container(workload)
        for arg in [*c.get("command", []), *c.get("args", [])]:
            assert not looks_secret.search(arg), f"{overlay}: {name}: {arg}"


def test_the_store_secret_example_has_every_key_prod_reads_and_example_values() -> None:
    docs = [d for d in yaml.safe_load_all(STORE_SECRET_EXAMPLE.read_text()) if d]
    [secret] = docs
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "halcyon-store"
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)
    data = secret["stringData"]
    read = {
        ref["secretKeyRef"]["key"]
        for w in workloads("prod").values()
        for ref in env_refs(container(w)).values()
        if ref.get("secretKeyRef", {}).get("name") == "halcyon-store"
    }
    assert read == set(data) == {"url", "password"}
    assert "example" in data["url"] and "example" in data["password"]
    # The URL carries no password: that is the password key's (as $PGPASSWORD).
    assert not re.search(r"://[^/@:]+:[^/@]+@", data["url"])


def test_the_controller_reads_its_store_url_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "postgresql://halcyon@db.example.internal:5432/halcyon"
    module_name, help_text = SUBCOMMANDS["controller"]
    module = importlib.import_module(module_name)
    monkeypatch.setenv("HALCYON_STORE", url)
    assert subcommand_parser("controller", module, help_text).parse_args([]).store == url
    monkeypatch.delenv("HALCYON_STORE")
    assert subcommand_parser("controller", module, help_text).parse_args([]).store is None


def test_dev_runs_one_of_each_with_small_requests() -> None:
    for name, workload in workloads("dev").items():
        assert workload["spec"].get("replicas", 1) == 1, name
        requests = container(workload)["resources"]["requests"]
        assert requests["cpu"].endswith("m") and int(requests["cpu"][:-1]) <= 100, name


def test_prod_scales_gateways_and_puts_workers_on_gpus_behind_network_policies() -> None:
    [hpa] = of_kind("prod", "HorizontalPodAutoscaler")
    pdbs = {p["metadata"]["name"]: p["spec"] for p in of_kind("prod", "PodDisruptionBudget")}
    assert hpa["spec"]["scaleTargetRef"]["name"] == "halcyon-gateway"
    assert hpa["spec"]["minReplicas"] > 1
    assert set(pdbs) == {"halcyon-controller", "halcyon-gateway", "halcyon-worker"}
    assert pods_selected("prod", pdbs["halcyon-gateway"]["selector"]["matchLabels"]) == {
        "halcyon-gateway"
    }
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
    # The dev overlay renders every Secret it reads.
    cluster = LocalCluster(
        list(render(overlay)), Objects(), tmp_path, entrypoint(DEPLOY / "Dockerfile"), free_port
    )
    try:
        cluster.start()
        cluster.wait_probes(timeout_s=45.0)
        for pod in cluster.pods:  # the kubelet ran it first; it answers still
            assert cluster.probe(pod, "startupProbe") == health_pb2.HealthCheckResponse.SERVING
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
