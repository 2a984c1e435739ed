"""Fleet-wide quota leases (issue #22, ADR 0003): pure, clock-injected policy, no I/O.

What it decides: how each tenant's contracted rate and burst are split among the gateways
that want them (:mod:`controller.quotas.allocator`, max-min fair on reported demand) and the
leases that carry those shares to the gateways (:mod:`controller.quotas.leases`). The gateway
side (enforcing a lease, falling back when it expires) is ``gateway.admission.quota_lease``.
The live wiring (a grant a second, leases onto the fleet streams) is
:mod:`controller.quotas.grants`, imported from there: it is the one part with a loop.
"""

from controller.quotas.allocator import Share, allocate
from controller.quotas.leases import Contract, QuotaLease, QuotaLeases

__all__ = ["Contract", "QuotaLease", "QuotaLeases", "Share", "allocate"]
