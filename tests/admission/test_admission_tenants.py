"""Tenants: config loading and validation, SHA-256-only keys, constant-time lookup."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import pytest

import gateway.admission.tenants as tenants_mod
from gateway.admission import Priority, TenantConfig, TenantRegistry, hash_api_key

EXAMPLE = Path(tenants_mod.__file__).with_name("tenants.example.yaml")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_demo_keys_authenticate_to_their_tenants() -> None:
    reg = TenantRegistry.demo()
    premium = reg.authenticate("demo-key-premium")
    standard = reg.authenticate("demo-key-standard")
    batch = reg.authenticate("demo-key-batch")
    assert premium is not None and premium.priority is Priority.CRITICAL
    assert standard is not None and standard.priority is Priority.STANDARD
    assert batch is not None and batch.priority is Priority.SHEDDABLE
    assert premium.rate > standard.rate > batch.rate
    assert reg.authenticate("demo-key-nope") is None
    assert reg.authenticate("") is None


def test_only_digests_are_stored() -> None:
    reg = TenantRegistry.demo()
    for tenant in reg:
        for stored in tenant.key_sha256:
            assert "demo-key" not in stored and len(stored) == 64
    assert "demo-key-premium" not in repr(list(reg))


def test_example_yaml_matches_the_demo_registry() -> None:
    reg = TenantRegistry.from_yaml(EXAMPLE)
    assert sorted(t.name for t in reg) == sorted(t.name for t in TenantRegistry.demo())
    for key, name in [("demo-key-premium", "premium"), ("demo-key-batch", "batch")]:
        tenant = reg.authenticate(key)
        assert tenant is not None and tenant.name == name
        assert tenant == TenantRegistry.demo().get(name)


def test_authenticate_compares_every_digest_without_early_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reg = TenantRegistry.from_mapping(
        {
            "tenants": [
                {
                    "name": f"t{i}",
                    "rate": 1,
                    "burst": 1,
                    "key_sha256": [digest(f"k{i}"), digest(f"x{i}")],
                }
                for i in range(5)
            ]
        }
    )
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for key in ("k0", "x4", "nobody"):  # first digest, last digest, no match
        calls.clear()
        reg.authenticate(key)
        assert len(calls) == 10
        # The presented key was hashed, never compared in the clear.
        assert all(a == hashlib.sha256(key.encode()).digest() for a, _ in calls)
    assert reg.authenticate("k0") == reg.get("t0")


def test_a_key_seen_recently_is_not_hashed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = TenantRegistry.demo()
    assert reg.authenticate("demo-key-premium") == reg.get("premium")
    assert reg.authenticate("nobody") is None
    hashed: list[bytes] = []
    real = hashlib.sha256

    def counting(data: bytes) -> Any:
        hashed.append(data)
        return real(data)

    monkeypatch.setattr(hashlib, "sha256", counting)
    assert reg.authenticate("demo-key-premium") == reg.get("premium")
    assert reg.authenticate("nobody") is None  # a refusal is remembered too
    assert hashed == []
    # Bounded: past the limit the memory starts over instead of growing.
    monkeypatch.setattr(tenants_mod, "_RECENT_KEYS", 3)
    for i in range(10):
        reg.authenticate(f"guess-{i}")
    assert len(reg._recent) <= 3
    assert reg.authenticate("demo-key-premium") == reg.get("premium")


def test_from_mapping_defaults_and_normalises() -> None:
    reg = TenantRegistry.from_mapping(
        {"tenants": [{"name": "a", "rate": 5, "burst": 10, "key_sha256": digest("k").upper()}]}
    )
    tenant = reg.authenticate("k")
    assert tenant is not None
    assert tenant.priority is Priority.STANDARD and tenant.rate == 5.0


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "tenants"),
        ({"tenants": [{"rate": 1, "burst": 1}]}, "missing field"),
        (
            {"tenants": [{"name": "a", "rate": 1, "burst": 1, "key_sha256": ["plaintext-key"]}]},
            "SHA-256",
        ),
        (
            {"tenants": [{"name": "a", "rate": 1, "burst": 1, "priority": "urgent"}]},
            "unknown priority",
        ),
        ({"tenants": [{"name": "a", "rate": -1, "burst": 1}]}, "rate"),
        ({"tenants": [{"name": "a", "rate": 1, "burst": 0}]}, "burst"),
        ({"tenants": [{"name": "a", "rate": 1, "burst": 1, "colour": "red"}]}, "unknown fields"),
        (
            {
                "tenants": [
                    {"name": "a", "rate": 1, "burst": 1},
                    {"name": "a", "rate": 1, "burst": 1},
                ]
            },
            "duplicate",
        ),
        (
            {
                "tenants": [
                    {"name": "a", "rate": 1, "burst": 1, "key_sha256": [digest("k")]},
                    {"name": "b", "rate": 1, "burst": 1, "key_sha256": [digest("k")]},
                ]
            },
            "both",
        ),
    ],
)
def test_invalid_configs_are_refused_with_a_reason(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TenantRegistry.from_mapping(data)


def test_empty_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("")
    with pytest.raises(ValueError):
        TenantRegistry.from_yaml(path)


def test_priority_parsing_ordering_and_capping() -> None:
    assert Priority.parse(" Critical ") is Priority.CRITICAL
    assert Priority.CRITICAL.rank < Priority.STANDARD.rank < Priority.SHEDDABLE.rank
    # A request may lower its importance, never raise it above its tenant's.
    assert Priority.CRITICAL.capped_by(Priority.STANDARD) is Priority.STANDARD
    assert Priority.SHEDDABLE.capped_by(Priority.STANDARD) is Priority.SHEDDABLE
    assert Priority.CRITICAL.capped_by(Priority.CRITICAL) is Priority.CRITICAL


def test_hash_api_key() -> None:
    assert hash_api_key("demo-key-standard") == (
        "e2bd0c0fe8e98b75603ec355da87ff35bb621925d7d243252a4abddcd20cd66f"
    )
    with pytest.raises(ValueError):
        TenantConfig("", (), 1.0, 1.0)
