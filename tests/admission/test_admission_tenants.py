"""Tenants: config loading and validation, SHA-256-only keys, constant-time lookup."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

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


def _registry_of(keys: dict[str, str]) -> TenantRegistry:
    return TenantRegistry.from_mapping(
        {
            "tenants": [
                {"name": name, "rate": 1, "burst": 1, "key_sha256": [digest(key)]}
                for name, key in keys.items()
            ]
        }
    )


def test_authenticate_compares_digests_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reg = _registry_of({f"t{i}": f"k{i}" for i in range(50)})
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for key, name in (("k0", "t0"), ("k49", "t49")):
        calls.clear()
        tenant = reg.authenticate(key)
        assert tenant is not None and tenant.name == name
        # One constant-time comparison of digests, whatever the number of tenants: the
        # presented key is hashed, never compared in the clear.
        presented = hashlib.sha256(key.encode()).digest()
        assert calls == [(presented, presented)]
    calls.clear()
    assert reg.authenticate("nobody") is None


def _reachable(root: object) -> list[object]:
    """Everything ``root`` holds through attributes and containers (not types or code)."""
    seen: dict[int, object] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type) or callable(obj):
            continue
        seen[id(obj)] = obj
        if isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
        elif hasattr(obj, "__dict__"):
            stack += list(vars(obj).values())
        elif hasattr(obj, "__slots__"):
            stack += [getattr(obj, n) for n in obj.__slots__ if hasattr(obj, n)]
    return list(seen.values())


def test_presented_keys_are_never_kept() -> None:
    key = "key-" + secrets.token_hex(16)  # built at run time: no interned constant to find
    reg = _registry_of({"acme": key})
    for _ in range(3):
        assert reg.authenticate(key) == reg.get("acme")
        assert reg.authenticate(key + "-wrong") is None
    held = _reachable(reg)
    assert not any(isinstance(o, str) and key in o for o in held)
    assert not any(isinstance(o, bytes) and key.encode() in o for o in held)
    # Only digests are held.
    assert hashlib.sha256(key.encode()).digest() in held


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
