"""Which model runtime a worker runs, built from its configuration.

What it decides: the one place where ``--runtime simulated|onnx|oip`` becomes a
:class:`~worker.runtime.ModelRuntime`. The ONNX Runtime and Open Inference Protocol adapters
are imported only when chosen, so a simulated worker never loads ``onnxruntime`` and a
machine without it can still run the default stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from common.clock import Clock
from worker.faults import FaultInjector
from worker.runtime import ModelRuntime, SimulatedDevice

__all__ = ["OipOptions", "OnnxOptions", "RuntimeKind", "SimulatedOptions", "build_runtime"]


class RuntimeKind(StrEnum):
    """The ``--runtime`` choices."""

    SIMULATED = "simulated"
    ONNX = "onnx"
    OIP = "oip"


@dataclass(frozen=True)
class OnnxOptions:
    """An in-process ONNX Runtime model (``--runtime onnx``)."""

    model_file: str
    threads: int = 1


@dataclass(frozen=True)
class OipOptions:
    """A remote Open Inference Protocol (KServe v2 gRPC) backend (``--runtime oip``)."""

    backend: str  # host:port of the backend's GRPCInferenceService
    backend_model: str
    backend_version: str = ""
    input_name: str = "text_input"
    max_tokens_name: str = "max_tokens"
    output_name: str = "text_output"
    readiness_interval_s: float = 1.0
    start_timeout_s: float = 30.0  # how long start waits for ServerReady and ModelReady
    call_timeout_s: float = 120.0  # a ModelInfer's own bound (cancellation ends it sooner)


@dataclass(frozen=True)
class SimulatedOptions:
    """The simulated device's constants (``--runtime simulated``, the default)."""

    intercept_ms: float = 18.0
    ms_per_token: float = 0.022
    speed: float = 1.0
    jitter: float = 0.08
    seed: int = 0


def build_runtime(
    kind: RuntimeKind,
    *,
    simulated: SimulatedOptions,
    onnx: OnnxOptions | None,
    oip: OipOptions | None,
    clock: Clock,
    faults: FaultInjector | None,
) -> ModelRuntime:
    """The runtime ``kind`` names, not yet started (``await runtime.start()`` loads it)."""
    if kind is RuntimeKind.SIMULATED:
        return SimulatedDevice(
            intercept_ms=simulated.intercept_ms,
            ms_per_token=simulated.ms_per_token,
            speed=simulated.speed,
            jitter=simulated.jitter,
            seed=simulated.seed,
            clock=clock,
            faults=faults,
        )
    if kind is RuntimeKind.ONNX:
        if onnx is None:
            raise ValueError("--runtime onnx needs --model-file PATH.onnx")
        from worker.onnx_runtime import OnnxRuntime

        return OnnxRuntime(onnx, clock=clock, faults=faults)
    if oip is None:
        raise ValueError("--runtime oip needs --backend HOST:PORT and --backend-model NAME")
    from worker.oip_runtime import OipRuntime

    return OipRuntime(oip, clock=clock, faults=faults)
