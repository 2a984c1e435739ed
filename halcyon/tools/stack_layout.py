"""The stack's layout: the model it serves, the fleet it starts, and its state directory's names.

What it decides: which replicas a ``halcyon stack`` runs (a deliberately heterogeneous fleet, a
fast v1 replica, a 0.6x straggler v1 replica, and with ``--canary`` a v2 replica on faster
hardware; or for ``--runtime onnx`` the same decoder on unequal CPU budgets), and the names of
the files it keeps in its state directory. Identical replicas make any load balancer look good;
this fleet does not. Kept apart from the supervisor so the sweep can describe its own fleet
with the same ``ReplicaSpec`` without the process machinery.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL = "llama-3-8b"
STATE_PREFIX = "halcyon-stack-"
OPERATOR_TOKEN_FILE = "operator-token"
PID_FILE = "stack.pid"


@dataclass(frozen=True)
class ReplicaSpec:
    replica_id: str
    version: str
    hardware: str
    speed: float
    threads: int = 1  # --runtime onnx: ONNX Runtime intra-op threads


BASE_FLEET = (
    ReplicaSpec("replica-a", "v1", "a10g", 1.0),
    ReplicaSpec("replica-b", "v1", "t4", 0.6),
)
CANARY = ReplicaSpec("replica-c", "v2", "h100", 1.6)
# --runtime onnx: the same generated decoder per version, on unequal CPU budgets (two
# intra-op threads against one), so the fleet is heterogeneous as the simulated one is. The
# canary runs other weights (another seed) of the same size: a new version of the model.
ONNX_FLEET = (
    ReplicaSpec("replica-a", "v1", "cpu-2t", 1.0, threads=2),
    ReplicaSpec("replica-b", "v1", "cpu-1t", 1.0, threads=1),
)
ONNX_CANARY = ReplicaSpec("replica-c", "v2", "cpu-1t", 1.0, threads=1)
ONNX_PRESET = "small"
ONNX_SEEDS = {"v1": 0, "v2": 1}


def gateway_name(index: int) -> str:
    """``gateway``, then ``gateway-2``, ``gateway-3``… (``--gateways N``)."""
    return "gateway" if index == 0 else f"gateway-{index + 1}"


def nth_address(listen: str, index: int) -> str:
    """The ``index``-th gateway's address: consecutive ports from ``listen``'s (port 0, any
    free port, stays 0)."""
    host, _, port = listen.rpartition(":")
    return listen if int(port) == 0 else f"{host}:{int(port) + index}"
