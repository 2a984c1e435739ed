"""Run a real ``halcyon`` server command with a fault hook in its completion-queue pump.

Usage: ``python tests/serving/fault_harness.py [--pretend-grpcio VERSION] COMMAND [ARGS...]``,
e.g. ``... worker --listen 127.0.0.1:0``. The process is the real command (``halcyon.cli``),
except that every completion-queue endpoint gets :func:`fault_hook`, which a client triggers
per call with the metadata ``x-halcyon-test-fault``:

* ``raise`` — the pump raises while handling this call's request (outside any handler);
* ``wedge:SECONDS`` — the pump blocks the event loop that long (a wedged data path);
* ``kill-poller`` — the poller thread raises at the next event it takes (the pump cannot go
  on).

``--pretend-grpcio`` makes the process see another ``grpc.__version__`` (a release the fast
path was not verified on). Test code only: the hook is set through ``RawUnaryEndpoint``'s
``fault_hook`` attribute, never by patching grpc.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from common.raw_unary import RawCall
from common.serving import ServiceHost

FAULT_KEY = "x-halcyon-test-fault"
_kill_poller = threading.Event()


def fault_hook(stage: str, call: RawCall | None) -> None:
    if stage == "poll":
        if _kill_poller.is_set():
            raise RuntimeError("injected: the poller thread dies")
        return
    assert call is not None
    fault = next((str(v) for k, v in call.metadata if k == FAULT_KEY), "")
    if fault == "raise":
        raise RuntimeError("injected: the pump fails on this call")
    if fault.startswith("wedge:"):
        time.sleep(float(fault.partition(":")[2]))
    elif fault == "kill-poller":
        _kill_poller.set()


def _install() -> None:
    add = ServiceHost.add_unary

    def add_with_hook(self: ServiceHost, *args: Any, **kwargs: Any) -> None:
        add(self, *args, **kwargs)
        self._raw_endpoints[-1].fault_hook = fault_hook

    ServiceHost.add_unary = add_with_hook  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pretend-grpcio"]:
        grpc.__version__ = argv[1]
        argv = argv[2:]
    _install()
    from halcyon.tools.cli import main as halcyon_main

    return halcyon_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
