"""Which model version serves a request: a sticky hash, not a coin flip.

A request's (model, session key) hashes to a bucket in [0, 10000). The canary takes the
buckets below its weight (basis points) and the configured stable version takes the rest, so
one session sees one version while the weight holds, and raising the weight only moves
sessions from baseline to canary, never back. Gateways share no state and still agree,
because the hash is the only input. The baseline is the controller's configured stable
version, never "whichever registered first".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

BUCKETS = 10_000


def session_bucket(model: str, session_key: str) -> int:
    """The session's stable position in [0, 10000) for this model."""
    digest = hashlib.blake2b(
        model.encode() + b"\x00" + session_key.encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big") % BUCKETS


@dataclass(frozen=True, slots=True)
class VersionSplit:
    """Routing weights for one model, as pushed by the controller."""

    model: str
    stable_version: str
    canary_version: str = ""
    canary_weight_bp: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.canary_weight_bp <= BUCKETS:
            raise ValueError(f"canary_weight_bp must be in [0, {BUCKETS}]")

    def version_for(self, session_key: str) -> str:
        """The version this session is assigned to under the current weights."""
        if (
            self.canary_version
            and self.canary_weight_bp > 0
            and session_bucket(self.model, session_key) < self.canary_weight_bp
        ):
            return self.canary_version
        return self.stable_version
