"""What a worker's ``--runtime`` choice is configured with: the choice and each runtime's options.

What it decides: only the shape of a runtime's configuration. It sits below both the runtimes
(:mod:`worker.onnx_runtime`, :mod:`worker.oip_runtime` read their options from here) and the
module that picks one (:mod:`worker.runtimes`), so that neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
