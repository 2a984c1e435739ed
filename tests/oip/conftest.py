"""Fixtures for the Open Inference Protocol tests (helpers in :mod:`tests.support.oip`).

* ``decoder_model`` (session): the generated ``small`` decoder, in a temporary directory.
* ``backends``: a :class:`~tests.support.oip.Backends` factory; its backends are killed at teardown.
* ``shared_backend`` (module): one backend with ``--directives`` (``#fail`` / ``#sleep=MS``
  prompts), ``--max-concurrent 2`` and ``--pushback-ms 250``, for tests that only send.
* ``launch``: the e2e Launcher for halcyon processes, stopped at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import e2e
from tests.support.oip import Backend, Backends


@pytest.fixture(scope="session")
def decoder_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated ``small`` decoder (seed 0), made once per session."""
    from worker.onnx_model import generate_preset

    return generate_preset(tmp_path_factory.mktemp("model") / "small-0.onnx", "small", 0)


@pytest.fixture
def backends(tmp_path: Path, decoder_model: Path) -> Iterator[Backends]:
    factory = Backends(tmp_path, decoder_model)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def shared_backend(
    tmp_path_factory: pytest.TempPathFactory, decoder_model: Path
) -> Iterator[Backend]:
    """One backend for the tests of a module that only send requests to it."""
    factory = Backends(tmp_path_factory.mktemp("backend"), decoder_model)
    try:
        yield factory.start(
            "--directives", "--max-concurrent", "2", "--pushback-ms", "250", name="shared"
        )
    finally:
        factory.close()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    """The e2e Launcher (halcyon processes), stopped at teardown."""
    launcher = e2e.Launcher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.close()


# Attach what the halcyon processes logged to a failing test's report, as the e2e suite does.
pytest_runtest_makereport = e2e.pytest_runtest_makereport
