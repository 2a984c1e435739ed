"""Helpers for the client tests: where the clients are, and the e2e launcher.

Real processes are started with the end-to-end launcher (:mod:`tests.support.e2e`), so every
suite starts, watches and stops processes the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support import e2e

__all__ = ["CLIENTS", "REPO", "SERVICE_CONFIG", "e2e", "retry_policy"]

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "clients"
SERVICE_CONFIG = CLIENTS / "service_config.json"


def retry_policy() -> dict[str, Any]:
    """The published config's retryPolicy (the one methodConfig, for InferService)."""
    config = json.loads(SERVICE_CONFIG.read_text())
    policy: dict[str, Any] = config["methodConfig"][0]["retryPolicy"]
    return policy
