"""Which grpcio the completion-queue fast path may run on: the verified releases and the shape.

What it decides: the data :func:`common.raw_unary.fast_path_refusal` checks before anything is
registered (ADR 0010). :data:`VERIFIED_GRPCIO` lists the grpcio minor releases the whole test
suite passed on; :data:`_SIGNATURES` and :data:`_ATTRIBUTES` are the names, parameters and
event fields of grpc internals that ``common.raw_unary`` calls. Kept apart so bumping grpcio
means editing a table, not reading the pump; the checks themselves stay in ``common.raw_unary``,
next to the ``cygrpc`` they inspect.
"""

from __future__ import annotations

# grpcio minor releases whose internals this module was verified against, with how. A release is
# verified when the whole test suite passes with it on both serving paths (`make test` runs the
# serving, gateway and worker tests on each) and tests/serving/test_fast_path_safety.py passes
# (fault isolation, wedge -> liveness, SIGTERM without a core abort). Patch releases of a listed
# minor are trusted: grpc changes its Cython layer in minor releases. Add a minor only after
# running that suite on it; anything else is served through grpc.aio with one log line.
VERIFIED_GRPCIO: dict[str, str] = {
    # 1.85.3 (constraints.txt): `make test`. 1.85.1: tests/serving, gateway, worker and e2e
    # on the fast path, and tests/serving, gateway and worker on grpc.aio.
    "1.85": "verified on 1.85.1 and 1.85.3",
}

# What this module calls on grpc internals: (owner, method) -> parameter names.
_SIGNATURES: dict[tuple[str, str], tuple[str, ...]] = {
    ("Server", "register_completion_queue"): ("self", "queue"),
    ("Server", "register_method"): ("self", "fully_qualified_method"),
    ("Server", "request_registered_call"): ("self", "call_queue", "server_queue", "method", "tag"),
    ("CompletionQueue", "poll"): ("self", "deadline"),
    ("CompletionQueue", "shutdown"): ("self",),
    ("Call", "start_server_batch"): ("self", "operations", "tag"),
    ("Call", "cancel"): ("self", "error_code", "details"),
}
# Event and operation attributes read off what the queue returns.
_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "CompletionType": ("operation_complete", "queue_shutdown", "queue_timeout"),
    "RequestCallEvent": ("call", "call_details", "invocation_metadata", "success", "tag"),
    "BatchOperationEvent": ("batch_operations", "success", "tag"),
    "CallDetails": ("deadline",),
    "ReceiveMessageOperation": ("message",),
    "ReceiveCloseOnServerOperation": ("cancelled",),
}
