"""What a DrainReplica / UndrainReplica answer tells the operator to expect and do next.

What it decides: the wording of ``next_steps``. A drain is not the end of a replica: it stays
registered and idle, shown as draining, and the operator has two ways on — put it back
(UndrainReplica) or stop its process (which deregisters it). Saying so in the answer means
nobody has to read the source to find the way back.
"""

from __future__ import annotations

import json

from controller.registry import Member

__all__ = ["after_drain", "after_undrain"]


def _request(member: Member) -> str:
    return json.dumps({"replica_id": member.replica_id})


def after_drain(member: Member) -> str:
    rid = member.replica_id
    return (
        f"replica {rid} is draining: gateways send it no new batches from now on and the "
        "batches it is running finish within its shutdown grace. It stays registered and "
        "idle, listed as draining in GetState. To put it back into service run "
        f"`halcyon fleet undrain {rid}` (or call halcyon.v1.ControlService/UndrainReplica with "
        f"{_request(member)}); to remove it for good stop its process (SIGTERM), and it "
        "deregisters."
    )


def after_undrain(member: Member, was_draining: bool) -> str:
    rid = member.replica_id
    if not was_draining:
        return f"replica {rid} was not draining: nothing to undo, it is serving."
    return (
        f"replica {rid} was told to take work again: gateways route to it once its next "
        "heartbeat reports it accepting batches (within one heartbeat interval). GetState "
        "shows draining=false from then on; DrainReplica takes it out again."
    )
