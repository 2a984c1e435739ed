"""Fixtures shared by every test directory: a throwaway PKI made with the openssl CLI.

(At the repository root rather than in ``tests/``: a ``tests/conftest.py`` would put ``tests/``
on ``sys.path``, where ``tests/bench`` would shadow the ``bench`` package.)

``pki`` (session scope) is a directory of PEM files, generated at test time and never
committed:

* ``ca.pem`` / ``ca.key`` — the private CA the fleet trusts;
* ``node.pem`` / ``node.key`` — a process certificate signed by it, valid for 127.0.0.1 and
  localhost, usable as both server and client certificate (mTLS between components);
* ``tenant.pem`` / ``tenant.key`` — a client-only certificate signed by it;
* ``rogue-ca.pem`` and ``rogue-node.*`` / ``rogue-tenant.*`` — the same, from a CA nobody
  trusts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.tools import require_tool

_SERVER_AND_CLIENT = (
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
)
_CLIENT_ONLY = "extendedKeyUsage=clientAuth\n"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _ca(name: str, d: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=d)
    _openssl(
        "req", "-x509", "-new", "-key", f"{name}.key", "-subj", f"/CN=halcyon-test-{name}",
        "-days", "1", "-out", f"{name}.pem", cwd=d,
    )  # fmt: skip


def _leaf(name: str, ca: str, ext: str, d: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=d)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-out", f"{name}.csr", cwd=d
    )
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "1", "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_tool("openssl")
    d = tmp_path_factory.mktemp("pki")
    _ca("ca", d)
    _ca("rogue-ca", d)
    _leaf("node", "ca", _SERVER_AND_CLIENT, d)
    _leaf("tenant", "ca", _CLIENT_ONLY, d)
    _leaf("rogue-node", "rogue-ca", _SERVER_AND_CLIENT, d)
    _leaf("rogue-tenant", "rogue-ca", _CLIENT_ONLY, d)
    return d
