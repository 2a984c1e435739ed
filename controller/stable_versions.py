"""Where each model's stable version comes from: configuration, or a later persisted decision.

What it decides: the effective stable version per model at controller start, from the
configured ones (``--stable MODEL=VERSION`` flags over the ``stable:`` map of the config file)
and the rows persisted in the store.

The rule, and why: a promotion (or an operator override) is a decision taken *after* the
configuration was written, so it survives a restart — but only while the configuration still
says what it said when the decision was taken. Each override row remembers the configured
version it replaced (``config_version``). If the operator has since changed the configuration
for that model, the new configuration is the newer intent and wins; the stale override is
dropped with a log note. Rows with source ``config`` only record what the configuration said,
so the store shows the whole picture; they are rewritten on every start.

Pure: parsing and reconciliation only; reading files and the store is the caller's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "Reconciliation",
    "StableRecord",
    "StableSource",
    "merge_configured",
    "parse_stable_assignment",
    "reconcile",
    "stable_map_from_config",
]


class StableSource(StrEnum):
    """Who set a stable version."""

    CONFIG = "config"
    PROMOTION = "promotion"
    OPERATOR = "operator"


@dataclass(frozen=True)
class StableRecord:
    """One persisted stable version. ``updated_at`` is wall-clock seconds since the epoch."""

    model: str
    version: str
    source: StableSource
    # The configured version this record replaced (overrides), or the configured version itself
    # (source CONFIG); None when nothing was configured for the model at the time.
    config_version: str | None
    updated_at: float


@dataclass(frozen=True)
class Reconciliation:
    """The result of :func:`reconcile`: what routes now and how to bring the store in line."""

    effective: dict[str, str]
    upserts: list[StableRecord] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def parse_stable_assignment(text: str) -> tuple[str, str]:
    """Parse ``MODEL=VERSION``; raise ValueError with a helpful message otherwise."""
    model, sep, version = text.partition("=")
    model, version = model.strip(), version.strip()
    if not sep or not model or not version or "=" in version:
        raise ValueError(f"expected MODEL=VERSION (for example resnet=v1), got {text!r}")
    return model, version


def stable_map_from_config(document: Any) -> dict[str, str]:
    """The ``stable:`` mapping of a parsed config document (``{"stable": {model: version}}``)."""
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ValueError("the config file must be a mapping with a 'stable' key")
    unknown = set(document) - {"stable"}
    if unknown:
        raise ValueError(f"unknown config keys {sorted(map(str, unknown))}; known: ['stable']")
    stable = document.get("stable") or {}
    if not isinstance(stable, Mapping):
        raise ValueError("'stable' must map model names to versions")
    out: dict[str, str] = {}
    for model, version in stable.items():
        if not isinstance(model, str) or not model:
            raise ValueError(f"model names must be non-empty strings, got {model!r}")
        if not isinstance(version, str | int | float) or not str(version):
            raise ValueError(f"version of {model!r} must be a non-empty string, got {version!r}")
        out[model] = str(version)
    return out


def merge_configured(
    from_file: Mapping[str, str], assignments: Iterable[tuple[str, str]]
) -> dict[str, str]:
    """Flags over file. The same model given two different versions by flags is an error."""
    merged = dict(from_file)
    seen: dict[str, str] = {}
    for model, version in assignments:
        if model in seen and seen[model] != version:
            raise ValueError(
                f"--stable names model {model!r} twice with different versions "
                f"({seen[model]!r} and {version!r})"
            )
        seen[model] = version
        merged[model] = version
    return merged


def reconcile(
    configured: Mapping[str, str], stored: Mapping[str, StableRecord], now: float
) -> Reconciliation:
    """The effective stable versions and the store changes that record them (module docstring)."""
    result = Reconciliation(effective={})
    for model in sorted(set(configured) | set(stored)):
        want = configured.get(model)
        row = stored.get(model)
        is_override = row is not None and row.source != StableSource.CONFIG
        if row is not None and is_override and row.config_version == want:
            result.effective[model] = row.version
            if want is not None and want != row.version:
                result.notes.append(
                    f"model {model!r}: stable {row.version!r} ({row.source}) overrides the "
                    f"configured {want!r}"
                )
            continue
        if want is None:
            if row is not None and is_override:
                # Configuration has dropped the model it had when the override was taken:
                # it has no opinion now, so the later decision still stands.
                result.effective[model] = row.version
            elif row is not None:
                result.deletes.append(model)
            continue
        result.effective[model] = want
        if row is not None and is_override:
            result.notes.append(
                f"model {model!r}: configuration changed from {row.config_version!r} to "
                f"{want!r}; the earlier {row.source} to {row.version!r} is superseded"
            )
        if row is None or (row.source, row.version, row.config_version) != (
            StableSource.CONFIG,
            want,
            want,
        ):
            result.upserts.append(StableRecord(model, want, StableSource.CONFIG, want, now))
    return result
