"""Rendered Kubernetes manifests, run as local processes the way a kubelet would run them.

What it decides: how a pod spec maps onto this machine, so the manifests are exercised rather
than read. Each Deployment/StatefulSet becomes one pod (``<name>-0``) whose container runs
its ``command``/``args`` (the image's ENTRYPOINT, from deploy/Dockerfile, when no command is
given) with its ``env`` resolved as the kubelet resolves it (values, ``secretKeyRef`` into the
rendered Secrets, ``fieldRef``) and ``$(VAR)`` references expanded. Nothing is rewritten
except what a cluster provides and a laptop does not:

* each declared ``containerPort`` gets a free loopback port; an address in the args on the
  pod's own IP, ``0.0.0.0`` or ``::`` at a declared port is moved to it (at an undeclared port
  it is an error: the manifest would not work);
* ``<service>:<port>`` (and its namespaced DNS forms) resolves through the rendered Service to
  the local port of the ``targetPort`` on the pod it selects — the cluster's DNS and kube-proxy;
* every ``volumeMount`` is a local directory: Secret and ConfigMap volumes filled with their
  rendered keys, emptyDir and claims empty; paths under a mount point move with it.

Probes run as the kubelet's: gRPC ``grpc.health.v1.Health/Check`` on the probe's port with the
probe's service name and ``timeoutSeconds``; ``preStop`` exec commands run before SIGTERM, and
the process must exit 0 within ``terminationGracePeriodSeconds`` counted from the preStop.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

Doc = dict[str, Any]
WORKLOADS = ("Deployment", "StatefulSet")
_HOSTPORT = re.compile(r"(?<![\w.\-/])(\[[0-9a-fA-F:]+\]|[A-Za-z0-9][A-Za-z0-9.\-]*):(\d{1,5})\b")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_POD_IP = "127.0.0.1"


class ManifestError(AssertionError):
    """The manifests cannot work as written (what a cluster would also reject or break on)."""


def entrypoint(dockerfile: Path) -> list[str]:
    """The image's ENTRYPOINT (exec form) from the Dockerfile's last stage."""
    found: list[str] | None = None
    for line in dockerfile.read_text().splitlines():
        if line.strip().upper().startswith("ENTRYPOINT"):
            found = json.loads(line.strip()[len("ENTRYPOINT") :].strip())
    if not found:
        raise ManifestError(f"{dockerfile} has no exec-form ENTRYPOINT")
    return found


def secret_data(doc: Doc) -> dict[str, str]:
    data = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
    data.update(doc.get("stringData") or {})
    return data


def _base_name(name: str) -> str:
    """A kustomize-generated name without its content hash (``x-6685tcd5f2`` -> ``x``)."""
    return re.sub(r"-[a-z0-9]{10}$", "", name)


@dataclass
class Objects:
    """The rendered objects a pod may refer to: Secrets and ConfigMaps (by name, also by the
    name before kustomize's hash suffix) and Services."""

    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    services: list[Doc] = field(default_factory=list)

    def add(self, docs: Iterable[Doc]) -> None:
        for doc in docs:
            name = doc["metadata"]["name"]
            if doc["kind"] == "Secret":
                self.secrets[name] = self.secrets[_base_name(name)] = secret_data(doc)
            elif doc["kind"] == "ConfigMap":
                data = dict(doc.get("data") or {})
                self.config_maps[name] = self.config_maps[_base_name(name)] = data
            elif doc["kind"] == "Service":
                self.services.append(doc)

    def secret(self, name: str) -> dict[str, str]:
        if name not in self.secrets:
            raise ManifestError(f"no Secret {name!r} (neither rendered nor provided)")
        return self.secrets[name]


@dataclass
class LocalPod:
    """One pod of a workload, run as a local process."""

    workload: Doc
    namespace: str
    workdir: Path
    ports: dict[int, int] = field(default_factory=dict)  # containerPort -> local port
    port_names: dict[str, int] = field(default_factory=dict)  # port name -> containerPort
    mounts: dict[str, Path] = field(default_factory=dict)  # mountPath -> local dir
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"{self.workload['metadata']['name']}-0"

    @property
    def spec(self) -> Doc:
        return dict(self.workload["spec"]["template"]["spec"])

    @property
    def container(self) -> Doc:
        [container] = self.spec["containers"]
        return dict(container)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.workload["spec"]["template"]["metadata"].get("labels") or {})

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def local(self, port: int | str) -> str:
        """The loopback address of one of the container's ports (number or name)."""
        number = self.port_names.get(port, port) if isinstance(port, str) else port
        if number not in self.ports:
            raise ManifestError(f"{self.name}: port {port!r} is not a declared containerPort")
        return f"127.0.0.1:{self.ports[number]}"

    def describe(self) -> str:
        state = "running" if self.proc and self.proc.poll() is None else "exited"
        try:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            tail = "(no log)"
        return f"{self.name} ({state}): {shlex.join(self.argv)}\n{tail}"


class LocalCluster:
    """Every workload of one rendered overlay as local processes; :meth:`close` stops them."""

    def __init__(
        self,
        docs: list[Doc],
        provided: Objects,
        workdir: Path,
        image_entrypoint: list[str],
        free_port: Any,
    ) -> None:
        # What the overlay expects to exist (``provided``, e.g. the dev overlay's Secrets for
        # prod, which contains none), then what it renders itself.
        self.objects = Objects()
        self.objects.secrets.update(provided.secrets)
        self.objects.config_maps.update(provided.config_maps)
        self.objects.add(docs)
        self.entrypoint = image_entrypoint
        self.pods: list[LocalPod] = []
        for doc in docs:
            if doc["kind"] in WORKLOADS:
                namespace = doc["metadata"].get("namespace", "default")
                pod = LocalPod(doc, namespace, workdir)
                for p in pod.container.get("ports", []):
                    pod.ports[p["containerPort"]] = free_port()
                    if "name" in p:
                        pod.port_names[p["name"]] = p["containerPort"]
                self.pods.append(pod)
        self._dns = self._service_addresses()
        for pod in self.pods:
            self._prepare(pod)

    # -- the cluster's DNS and kube-proxy ----------------------------------------------------

    def _service_addresses(self) -> dict[str, str]:
        table: dict[str, str] = {}
        for svc in self.objects.services:
            selector = svc["spec"].get("selector") or {}
            backends = [
                p for p in self.pods if all(p.labels.get(k) == v for k, v in selector.items())
            ]
            if not backends:
                continue
            pod = backends[0]
            name = svc["metadata"]["name"]
            namespace = svc["metadata"].get("namespace", "default")
            for port in svc["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                address = pod.local(target)
                for host in (
                    name,
                    f"{name}.{namespace}",
                    f"{name}.{namespace}.svc",
                    f"{name}.{namespace}.svc.cluster.local",
                ):
                    table[f"{host}:{port['port']}"] = address
        return table

    def service(self, name: str, port: int) -> str:
        key = f"{name}:{port}"
        if key not in self._dns:
            raise ManifestError(f"no Service {name} with port {port} selecting a workload")
        return self._dns[key]

    # -- one pod ---------------------------------------------------------------------------

    def _prepare(self, pod: LocalPod) -> None:
        spec, container = pod.spec, pod.container
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {
            c["metadata"]["name"] for c in pod.workload["spec"].get("volumeClaimTemplates", [])
        }
        for mount in container.get("volumeMounts", []):
            local = pod.workdir / pod.name / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            volume = volumes.get(mount["name"])
            if volume is None:
                if mount["name"] not in claims:
                    raise ManifestError(f"{pod.name}: volumeMount {mount['name']!r} has no volume")
            elif "secret" in volume:
                for key, value in self.objects.secret(volume["secret"]["secretName"]).items():
                    (local / key).write_text(value)
            elif "configMap" in volume:
                name = volume["configMap"]["name"]
                if name not in self.objects.config_maps:
                    raise ManifestError(f"{pod.name}: no ConfigMap {name!r}")
                for key, value in self.objects.config_maps[name].items():
                    (local / key).write_text(value)
            pod.mounts[mount["mountPath"]] = local
        pod.env = self._env(pod)
        command = container.get("command") or list(self.entrypoint)
        args = [self._expand(a, pod.env) for a in container.get("args", [])]
        command = [self._expand(c, pod.env) for c in command]
        pod.argv = [*self._program(command), *(self._localize(pod, a) for a in args)]

    def _env(self, pod: LocalPod) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in pod.container.get("env", []):
            name = item["name"]
            if "value" in item:
                env[name] = self._expand(str(item["value"]), env)
                continue
            source = item["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                data = self.objects.secret(ref["name"])
                if ref["key"] not in data:
                    raise ManifestError(f"{pod.name}: Secret {ref['name']} has no key {ref['key']}")
                env[name] = data[ref["key"]]
            elif "fieldRef" in source:
                field_path = source["fieldRef"]["fieldPath"]
                env[name] = {
                    "status.podIP": _POD_IP,
                    "metadata.name": pod.name,
                    "metadata.namespace": pod.namespace,
                }[field_path]
            else:
                raise ManifestError(f"{pod.name}: env {name} from {sorted(source)} not handled")
        return env

    @staticmethod
    def _expand(text: str, env: dict[str, str]) -> str:
        # Kubernetes leaves a reference to an undefined variable as written.
        return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)

    def _program(self, command: list[str]) -> list[str]:
        if command[0] != "halcyon":
            raise ManifestError(f"unknown program {command[0]!r} (the image runs halcyon)")
        return [sys.executable, "-m", "halcyon", *command[1:]]

    def _localize(self, pod: LocalPod, arg: str) -> str:
        def address(match: re.Match[str]) -> str:
            host, port = match.group(1), int(match.group(2))
            if host in ("0.0.0.0", "[::]", _POD_IP, "localhost"):
                return pod.local(port)
            key = f"{host}:{port}"
            if key in self._dns:
                return self._dns[key]
            if "." not in host and not host[0].isdigit():
                # Looks like a Service name: one that does not exist breaks in a cluster too.
                raise ManifestError(f"{pod.name}: {key} names no Service port")
            return match.group(0)

        arg = _HOSTPORT.sub(address, arg)
        if not pod.mounts:
            return arg
        # One pass, longest mount first, so a replaced path is never rewritten again.
        paths = sorted(pod.mounts, key=len, reverse=True)
        pattern = "|".join(f"{re.escape(p)}(?=/|$)" for p in paths)
        return re.sub(pattern, lambda m: str(pod.mounts[m.group(0)]), arg)

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HALCYON_", "OTEL_"))}
        for pod in self.pods:
            with open(pod.log, "wb") as log:
                pod.proc = subprocess.Popen(
                    pod.argv,
                    env={**base, **pod.env, "PYTHONUNBUFFERED": "1"},
                    cwd=pod.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

    def describe(self) -> str:
        return "\n\n".join(p.describe() for p in self.pods)

    def probe(self, pod: LocalPod, kind: str) -> int:
        """One kubelet probe (``livenessProbe``/``readinessProbe``): the health status."""
        probe = pod.container[kind]
        if "grpc" not in probe:
            raise ManifestError(f"{pod.name}: {kind} is not a gRPC probe")
        with grpc.insecure_channel(pod.local(probe["grpc"]["port"])) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                timeout=probe.get("timeoutSeconds", 1),
            )
        return int(reply.status)

    def wait_probes(self, timeout_s: float) -> None:
        """Every pod's liveness and readiness probes answer SERVING within ``timeout_s``."""
        serving = health_pb2.HealthCheckResponse.SERVING
        pending = {
            (p.name, kind): p for p in self.pods for kind in ("livenessProbe", "readinessProbe")
        }
        deadline = time.monotonic() + timeout_s
        last: dict[tuple[str, str], object] = {}
        while pending:
            for (name, kind), pod in list(pending.items()):
                assert pod.proc is not None
                if pod.proc.poll() is not None:
                    raise AssertionError(f"{name} exited during start-up:\n{self.describe()}")
                try:
                    status = self.probe(pod, kind)
                except grpc.RpcError as err:
                    last[(name, kind)] = err.code()
                    continue
                last[(name, kind)] = status
                if status == serving:
                    del pending[(name, kind)]
            if pending and time.monotonic() > deadline:
                raise AssertionError(
                    f"probes not SERVING after {timeout_s} s: "
                    f"{ {k: last.get(k) for k in pending} }\n{self.describe()}"
                )
            time.sleep(0.2)

    def terminate(self) -> dict[str, tuple[int | None, float, float]]:
        """Stop every pod as the kubelet does: preStop, then SIGTERM, all pods at once.

        Returns pod name -> (exit code or None if still running at the end of its grace,
        seconds from preStop to exit, terminationGracePeriodSeconds).
        """
        started = time.monotonic()
        hooks: dict[str, subprocess.Popen[bytes]] = {}
        for pod in self.pods:
            hook = pod.container.get("lifecycle", {}).get("preStop", {}).get("exec")
            if hook:
                hooks[pod.name] = subprocess.Popen(
                    hook["command"], env={"PATH": os.environ["PATH"]}
                )
        results: dict[str, tuple[int | None, float, float]] = {}
        for pod in self.pods:
            if pod.name in hooks:
                hooks[pod.name].wait(timeout=120)
            assert pod.proc is not None
            pod.proc.send_signal(signal.SIGTERM)
        for pod in self.pods:
            assert pod.proc is not None
            grace = float(pod.spec.get("terminationGracePeriodSeconds", 30))
            left = max(0.0, started + grace - time.monotonic())
            try:
                code: int | None = pod.proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                code = None
            results[pod.name] = (code, time.monotonic() - started, grace)
        return results

    def close(self) -> None:
        for pod in self.pods:
            if pod.proc is not None and pod.proc.poll() is None:
                pod.proc.kill()
                pod.proc.wait(timeout=10)
