"""What a process runs, said once on its metrics endpoint and in its spans' resource.

What it decides: ``halcyon_build_info`` — a gauge that is always 1, whose labels say which
Halcyon (``version``, the installed package's version from ``importlib.metadata``), which
grpcio (``grpcio``, ``grpc.__version__``: the completion-queue path depends on it, ADR 0010),
the path serving the process's hot unary methods (``serving_path``: ``fast``, the
completion-queue endpoints, or ``aio``, grpc.aio — the controller, which has no hot unary
method, says ``aio``) and which ``component`` (controller, gateway, worker) it is. The usual
Prometheus "info" idiom: join it onto other series with ``* on (instance) group_left(version)``
and count the versions of a fleet mid-upgrade with ``count by (version) (halcyon_build_info)``.

One function, called by :class:`common.serving.ServiceHost` once the serving path is chosen, so
every process exports it and none writes its own.
"""

from __future__ import annotations

import importlib.metadata

import grpc
from prometheus_client import CollectorRegistry, Gauge

__all__ = ["BUILD_INFO", "export_build_info", "halcyon_version"]

BUILD_INFO = "halcyon_build_info"


def halcyon_version() -> str:
    """The installed ``halcyon`` package's version (``unknown`` in a tree never installed)."""
    try:
        return importlib.metadata.version("halcyon")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def export_build_info(registry: CollectorRegistry, component: str, serving_path: str) -> None:
    """Register ``halcyon_build_info{component, version, grpcio, serving_path} 1``."""
    Gauge(
        BUILD_INFO,
        "Always 1: the Halcyon and grpcio versions this process runs, the path serving its hot "
        "unary methods (fast: completion queue; aio: grpc.aio) and its component.",
        ["component", "version", "grpcio", "serving_path"],
        registry=registry,
    ).labels(component, halcyon_version(), grpc.__version__, serving_path).set(1)
