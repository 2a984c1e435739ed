"""Which model runtime a worker runs, built from its configuration.

What it decides: the one place where ``--runtime simulated|onnx|oip`` becomes a
:class:`~worker.runtime.ModelRuntime`. The ONNX Runtime and Open Inference Protocol adapters
are imported only when chosen, so a simulated worker never loads ``onnxruntime`` and a
machine without it can still run the default stack.
"""

from __future__ import annotations

from common.clock import Clock
from worker.faults import FaultInjector
from worker.runtime import ModelRuntime, SimulatedDevice
from worker.runtime_options import OipOptions, OnnxOptions, RuntimeKind, SimulatedOptions

__all__ = ["OipOptions", "OnnxOptions", "RuntimeKind", "SimulatedOptions", "build_runtime"]


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
