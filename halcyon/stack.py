"""``halcyon stack``: the whole system on loopback, one process per component, supervised.

Starts a controller, a deliberately heterogeneous fleet (a fast v1 replica, a 0.6x straggler
v1 replica, and with ``--canary`` a v2 replica on faster hardware) and a gateway, each as its
own ``halcyon`` process, restarts any that dies, and stops them in order when asked. This
module is where existing code imports from; each part now lives in a sibling of one job:

* ``halcyon.stack_layout``: the model, the fleets (``ReplicaSpec``) and the state
  directory's file names.
* ``halcyon.stack_supervisor``: the child-process supervisor (``Child``, ``Stack``): spawn
  in dependency order, restart with backoff, stop in reverse; process groups and the
  parent-death signal so nothing is left behind.
* ``halcyon.stack_howto``: the printed how-to-call text, commands that work when pasted.
* ``halcyon.stack_cli``: the command's flags, the checks before anything starts (ports,
  runtime, credentials given to children through their environment) and its run, with the
  state directory's creation and clean-up.
"""

from __future__ import annotations

from halcyon.stack_cli import (
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
from halcyon.stack_howto import (
    _tool,
    describe_stack,
)
from halcyon.stack_layout import (
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
from halcyon.stack_supervisor import (
    _PR_SET_PDEATHSIG,
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
    parent_death_signal,
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
    "_PR_SET_PDEATHSIG",
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
    "parent_death_signal",
    "remove_stale_state_dirs",
    "run",
]
