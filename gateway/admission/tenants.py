"""Tenants: who is calling, how much work they may ask for, and how important it is.

What it decides: which tenant an API key belongs to (or none), and each tenant's quota
(``rate`` and ``burst`` in tokens of predicted work) and priority.

Why this shape:

* Keys are stored only as SHA-256 hex digests; a leaked config file leaks no usable key, and
  the gateway never keeps a presented key (no cache of raw keys: a memory dump shows digests
  only). :meth:`TenantRegistry.authenticate` hashes the presented key, finds the one candidate
  entry by that digest, and confirms it with :func:`hmac.compare_digest`. The lookup's timing
  can only tell a caller how the SHA-256 of their own guess compares with stored digests —
  nothing about any key, short of inverting SHA-256 (and Python hashes the dictionary's bytes
  keys under a per-process random key besides). The cost per request is one hash of a short
  string and one dictionary lookup (~0.8 us), whatever the number of tenants.
* Priorities have a small fixed domain (:class:`Priority`) so that they can be metric labels
  and map one-to-one from the proto enum. They are loaded from config and actually used by
  the shedder (defect 15 of the original: priorities never loaded, shedding never acted).
* Quotas are in tokens of predicted work (prompt tokens plus requested output tokens), not
  requests: one 4,000-token request is not the same load as one 16-token request.

Config format (YAML or an equivalent mapping)::

    tenants:
      - name: acme
        priority: standard          # critical | standard | sheddable
        rate: 20000                 # predicted-work tokens per second
        burst: 60000                # bucket size, tokens
        key_sha256:
          - 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08

``printf %s "$KEY" | sha256sum`` gives a key's digest. :meth:`TenantRegistry.demo` is a
working default for local runs, with demo keys ``demo-key-premium`` (critical, large quota),
``demo-key-standard`` and ``demo-key-batch`` (sheddable).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Priority", "Tenant", "TenantConfig", "TenantRegistry", "hash_api_key"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class Priority(StrEnum):
    """How sheddable a request is, most important first."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"

    @property
    def rank(self) -> int:
        """0 for the most important; larger is shed sooner."""
        return _RANK[self]

    @classmethod
    def parse(cls, text: str) -> Priority:
        try:
            return cls(text.strip().lower())
        except ValueError:
            allowed = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown priority {text!r}; expected one of {allowed}") from None

    def capped_by(self, ceiling: Priority) -> Priority:
        """This priority, but no more important than ``ceiling`` (a tenant's own priority).

        A request may ask to be treated as less important than its tenant, never more.
        """
        return self if self.rank >= ceiling.rank else ceiling


_RANK = {Priority.CRITICAL: 0, Priority.STANDARD: 1, Priority.SHEDDABLE: 2}


def hash_api_key(api_key: str) -> str:
    """The SHA-256 hex digest under which a key is stored."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TenantConfig:
    """One tenant: identity, key digests, quota and priority."""

    name: str
    key_sha256: tuple[str, ...]
    rate: float
    """Predicted-work tokens per second added to the tenant's bucket."""
    burst: float
    """Bucket capacity in predicted-work tokens."""
    priority: Priority = Priority.STANDARD

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tenant needs a name")
        for digest in self.key_sha256:
            if not _HEX64.match(digest):
                raise ValueError(
                    f"tenant {self.name!r}: key_sha256 entries must be 64 lowercase hex "
                    f"characters (a SHA-256 digest, never the key itself)"
                )
        if not (math.isfinite(self.rate) and self.rate >= 0.0):
            raise ValueError(f"tenant {self.name!r}: rate must be >= 0, got {self.rate}")
        if not (math.isfinite(self.burst) and self.burst > 0.0):
            raise ValueError(f"tenant {self.name!r}: burst must be > 0, got {self.burst}")


Tenant = TenantConfig
"""What :meth:`TenantRegistry.authenticate` returns: the caller's tenant configuration."""


class TenantRegistry:
    """All tenants, looked up by key digest in constant time."""

    def __init__(self, tenants: Iterable[TenantConfig]) -> None:
        self._tenants: dict[str, TenantConfig] = {}
        seen: dict[str, str] = {}
        for tenant in tenants:
            if tenant.name in self._tenants:
                raise ValueError(f"duplicate tenant name {tenant.name!r}")
            for digest in tenant.key_sha256:
                if digest in seen:
                    raise ValueError(
                        f"one key digest is listed for both {seen[digest]!r} and {tenant.name!r}"
                    )
                seen[digest] = tenant.name
            self._tenants[tenant.name] = tenant
        # Indexed by digest: finding the candidate is one dictionary lookup (see the module
        # docstring for why its timing gives nothing away).
        self._by_digest: dict[bytes, tuple[bytes, TenantConfig]] = {}
        for tenant in self._tenants.values():
            for hex_digest in tenant.key_sha256:
                stored = bytes.fromhex(hex_digest)
                self._by_digest[stored] = (stored, tenant)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TenantRegistry:
        """Build from ``{"tenants": [{name, priority, rate, burst, key_sha256}, ...]}``."""
        if not isinstance(data, Mapping) or not isinstance(data.get("tenants"), list):
            raise ValueError("tenant config must be a mapping with a 'tenants' list")
        tenants = []
        for i, entry in enumerate(data["tenants"]):
            if not isinstance(entry, Mapping):
                raise ValueError(f"tenants[{i}] must be a mapping")
            unknown = set(entry) - {"name", "priority", "rate", "burst", "key_sha256"}
            if unknown:
                raise ValueError(f"tenants[{i}]: unknown fields {sorted(unknown)}")
            try:
                keys = entry.get("key_sha256", [])
                if isinstance(keys, str):
                    keys = [keys]
                tenants.append(
                    TenantConfig(
                        name=str(entry["name"]),
                        key_sha256=tuple(str(k).strip().lower() for k in keys),
                        rate=float(entry["rate"]),
                        burst=float(entry["burst"]),
                        priority=Priority.parse(str(entry.get("priority", "standard"))),
                    )
                )
            except KeyError as missing:
                raise ValueError(f"tenants[{i}]: missing field {missing}") from None
            except (TypeError, ValueError) as bad:
                raise ValueError(f"tenants[{i}]: {bad}") from None
        return cls(tenants)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TenantRegistry:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
        return cls.from_mapping(data if data is not None else {})

    @classmethod
    def demo(cls) -> TenantRegistry:
        """Demo tenants for local runs; the keys are public, never use them in production.

        ``demo-key-premium`` -> ``premium`` (critical, 2M tokens/s, burst 4M: benchmarks run on it),
        ``demo-key-standard`` -> ``standard`` (standard, 50k/s, burst 100k),
        ``demo-key-batch`` -> ``batch`` (sheddable, 20k/s, burst 40k).
        """
        return cls(
            [
                TenantConfig(
                    "premium",
                    ("a236634bf0c5b765ed511a135728313cd986f9116ff5e6e39b968b8b2eddd587",),
                    rate=2_000_000.0,
                    burst=4_000_000.0,
                    priority=Priority.CRITICAL,
                ),
                TenantConfig(
                    "standard",
                    ("e2bd0c0fe8e98b75603ec355da87ff35bb621925d7d243252a4abddcd20cd66f",),
                    rate=50_000.0,
                    burst=100_000.0,
                    priority=Priority.STANDARD,
                ),
                TenantConfig(
                    "batch",
                    ("b1ad6faeb3697d93f457d63a5d86be8567af7894022540096a600cb876f2da9f",),
                    rate=20_000.0,
                    burst=40_000.0,
                    priority=Priority.SHEDDABLE,
                ),
            ]
        )

    # -- lookup -------------------------------------------------------------------------------

    def authenticate(self, api_key: str) -> Tenant | None:
        """The tenant whose stored digest matches ``api_key``'s, or None (see the module
        docstring for why this is constant-time and keeps no key)."""
        presented = hashlib.sha256(api_key.encode("utf-8")).digest()
        entry = self._by_digest.get(presented)
        if entry is None:
            return None
        stored, tenant = entry
        return tenant if hmac.compare_digest(presented, stored) else None

    def get(self, name: str) -> TenantConfig | None:
        return self._tenants.get(name)

    def __iter__(self) -> Iterator[TenantConfig]:
        return iter(self._tenants.values())

    def __len__(self) -> int:
        return len(self._tenants)

    def __contains__(self, name: object) -> bool:
        return name in self._tenants
