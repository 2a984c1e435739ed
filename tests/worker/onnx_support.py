"""What the ONNX tests share: onnxruntime and onnx, required — a skip on a developer's machine
without them, a failure under CI (which installs the dev extra that has them)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(name: str) -> ModuleType:
    """Import ``name``; skip the calling module without it, fail under CI."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        message = f"{name} is not importable ({exc}); pip install -e '.[onnx]'"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI installs the dev extra, which has it)")
        pytest.skip(message, allow_module_level=True)


def require_onnx() -> None:
    require("onnxruntime")
    require("onnx")
