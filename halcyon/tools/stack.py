"""``halcyon stack``: the whole system on loopback, one process per component, supervised.

Starts a controller, a deliberately heterogeneous fleet (a fast v1 replica, a 0.6x straggler
v1 replica, and with ``--canary`` a v2 replica on faster hardware) and a gateway, each as its
own ``halcyon`` process, restarts any that dies, and stops them in order when asked. This
module is where existing code imports from; each part now lives in a sibling of one job:

* ``halcyon.tools.stack_layout``: the model, the fleets (``ReplicaSpec``) and the state
  directory's file names.
* ``halcyon.tools.stack_supervisor``: the child-process supervisor (``Child``, ``Stack``): spawn
  in dependency order, restart with backoff, stop in reverse; started by
  ``halcyon.tools.launcher`` so nothing is left behind.
* ``halcyon.tools.stack_howto``: the printed how-to-call text, commands that work when pasted.
* ``halcyon.tools.stack_cli``: the command's flags, the checks before anything starts (ports,
  runtime, credentials given to children through their environment) and its run, with the
  state directory's creation and clean-up.
"""

from __future__ import annotations

from halcyon.tools.stack_cli import (
    _alive,
    _check_ports,
    _check_runtime,
    _child_env,
    _make_state_dir,
    _write_private,
    configure,
    remove_stale_state_dirs,
    run,
)
from halcyon.tools.stack_howto import (
    _tool,
    describe_stack,
)
from halcyon.tools.stack_layout import (
    BASE_FLEET,
    CANARY,
    MODEL,
    ONNX_CANARY,
    ONNX_FLEET,
    ONNX_PRESET,
    ONNX_SEEDS,
    OPERATOR_TOKEN_FILE,
    PID_FILE,
    STATE_PREFIX,
    ReplicaSpec,
)
from halcyon.tools.stack_supervisor import (
    CHILD_DRAIN_DELAY_S,
    CHILD_SHUTDOWN_GRACE_S,
    HURRY_TIMEOUT_S,
    POLL_S,
    READY_TIMEOUT_S,
    RESTART_BACKOFF_S,
    STABLE_AFTER_S,
    STOP_TIMEOUT_S,
    Child,
    Stack,
    StackError,
    _exit_text,
    _flags,
    _say,
    _Signals,
    _StopRequested,
)

__all__ = [
    "BASE_FLEET",
    "CANARY",
    "CHILD_DRAIN_DELAY_S",
    "CHILD_SHUTDOWN_GRACE_S",
    "HURRY_TIMEOUT_S",
    "MODEL",
    "ONNX_CANARY",
    "ONNX_FLEET",
    "ONNX_PRESET",
    "ONNX_SEEDS",
    "OPERATOR_TOKEN_FILE",
    "PID_FILE",
    "POLL_S",
    "READY_TIMEOUT_S",
    "RESTART_BACKOFF_S",
    "STABLE_AFTER_S",
    "STATE_PREFIX",
    "STOP_TIMEOUT_S",
    "Child",
    "ReplicaSpec",
    "Stack",
    "StackError",
    "_Signals",
    "_StopRequested",
    "_alive",
    "_check_ports",
    "_check_runtime",
    "_child_env",
    "_exit_text",
    "_flags",
    "_make_state_dir",
    "_say",
    "_tool",
    "_write_private",
    "configure",
    "describe_stack",
    "remove_stale_state_dirs",
    "run",
]
