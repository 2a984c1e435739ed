"""The end-to-end launcher as a library: real ``halcyon`` processes on 127.0.0.1:0.

What it decides: that every suite starts, watches and stops processes with one launcher. The
launcher is ``tests/e2e/conftest.py`` (pytest loads it there as that directory's conftest); other
suites import it from here as :data:`e2e`, one module instance shared by all of them, instead of
each loading the file by path.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["LAUNCHER_FILE", "e2e"]

LAUNCHER_FILE = Path(__file__).resolve().parents[1] / "e2e" / "conftest.py"
_MODULE = "halcyon_tests_e2e_launcher"


def _load() -> ModuleType:
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    spec = importlib.util.spec_from_file_location(_MODULE, LAUNCHER_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module
    spec.loader.exec_module(module)
    return module


e2e = _load()
