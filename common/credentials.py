"""Where a process's secrets come from: token files, the environment, or development mode.

What it decides: the fleet and operator credentials a server starts with, and whether it may
start at all.

* A secret never travels on a command line (``ps`` shows every local user every process's
  arguments): ``--fleet-token-file PATH`` / ``--operator-token-file PATH`` (the file's content,
  surrounding whitespace stripped) or ``$HALCYON_FLEET_TOKEN`` / ``$HALCYON_OPERATOR_TOKEN``; a
  file wins over the environment. The old ``--fleet-token`` / ``--operator-token`` flags are
  refused with a message pointing at these.
* No default way in: a server that needs a credential and has none refuses to start, with a
  one-line message saying what to pass. The public development tokens (and the gateway's demo
  tenants) are accepted only in **development mode** (``--dev-mode`` or
  ``HALCYON_DEV_MODE=1``), and development mode only on a loopback listen address — so a
  public credential is never reachable from another machine.

Why files and the environment: both are readable only by the process's user (a Kubernetes
Secret mounts as either), unlike arguments, which ``/proc/PID/cmdline`` shows everyone.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.auth import METHOD_ACCESS, Access, AuthPolicy

__all__ = [
    "DEV_FLEET_TOKEN",
    "DEV_MODE_ENV",
    "DEV_OPERATOR_TOKEN",
    "FLEET_TOKEN_ENV",
    "OPERATOR_TOKEN_ENV",
    "CredentialError",
    "Credentials",
    "add_credential_arguments",
    "dev_mode_from_args",
    "is_loopback",
    "load_credentials",
    "require_loopback_for_dev_mode",
]

DEV_FLEET_TOKEN = "dev-fleet-token"
DEV_OPERATOR_TOKEN = "dev-operator-token"
FLEET_TOKEN_ENV = "HALCYON_FLEET_TOKEN"
OPERATOR_TOKEN_ENV = "HALCYON_OPERATOR_TOKEN"
DEV_MODE_ENV = "HALCYON_DEV_MODE"

_log = logging.getLogger("halcyon.credentials")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


class CredentialError(ValueError):
    """A server cannot start with the credentials it was given; the message says what to do."""


@dataclass(frozen=True)
class _Kind:
    role: Access
    env: str
    dev_token: str

    @property
    def flag(self) -> str:
        return f"--{self.role}-token-file"


_FLEET = _Kind(Access.FLEET, FLEET_TOKEN_ENV, DEV_FLEET_TOKEN)
_OPERATOR = _Kind(Access.OPERATOR, OPERATOR_TOKEN_ENV, DEV_OPERATOR_TOKEN)


@dataclass(frozen=True)
class Credentials:
    """The credentials a process holds (None: not configured) and whether it runs in dev mode."""

    fleet: str | None
    operator: str | None
    dev_mode: bool = False

    def policy(self) -> AuthPolicy:
        """The server-side gate for these credentials over the full method table."""
        return AuthPolicy(fleet_token=self.fleet, operator_token=self.operator, rules=METHOD_ACCESS)

    def __repr__(self) -> str:  # never print a secret by accident
        held = [k for k in ("fleet", "operator") if getattr(self, k) is not None]
        return f"Credentials(holds={held}, dev_mode={self.dev_mode})"


class _RefuseSecretFlag(argparse.Action):
    """``--fleet-token VALUE``: refused, because the value would be visible in ``ps``."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self._kind = kwargs.pop("kind")
        super().__init__(option_strings, dest, nargs=1, help=argparse.SUPPRESS)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind: _Kind = self._kind
        parser.error(
            f"{option_string} would put the secret on the command line, visible to every "
            f"local user in ps; use {kind.flag} PATH or set ${kind.env}"
        )


def add_credential_arguments(
    parser: argparse.ArgumentParser,
    *,
    fleet_use: str,
    operator_use: str | None = None,
    dev_mode_flag: bool = True,
) -> None:
    """``--fleet-token-file --operator-token-file --dev-mode`` (and the refused old flags).

    ``fleet_use`` / ``operator_use`` say in the help what this process does with each
    credential; ``operator_use`` None means the operator credential is optional here.
    ``dev_mode_flag`` False leaves out ``--dev-mode`` (a command that always runs in it).
    """
    group = parser.add_argument_group("credentials (never on the command line)")
    fallback = "required unless --dev-mode" if dev_mode_flag else "else the public dev token"
    group.add_argument(
        "--fleet-token-file",
        type=Path,
        metavar="PATH",
        help=f"file holding the fleet credential, {fleet_use} "
        f"(default: ${FLEET_TOKEN_ENV}; {fallback})",
    )
    operator_help = (
        f"file holding the operator credential, {operator_use} "
        f"(default: ${OPERATOR_TOKEN_ENV}; {fallback})"
        if operator_use
        else "file holding the operator credential; optional, only so that an operator token "
        f"sent here is refused as WRONG_ROLE (default: ${OPERATOR_TOKEN_ENV}, else none)"
    )
    group.add_argument("--operator-token-file", type=Path, metavar="PATH", help=operator_help)
    if dev_mode_flag:
        group.add_argument(
            "--dev-mode",
            action="store_true",
            default=None,
            help="development mode: accept the public dev credentials (and on a gateway the "
            "demo tenants) when none are configured; loopback listen addresses only "
            f"(default: ${DEV_MODE_ENV}=1, else off)",
        )
    group.add_argument("--fleet-token", action=_RefuseSecretFlag, kind=_FLEET)
    group.add_argument("--operator-token", action=_RefuseSecretFlag, kind=_OPERATOR)


def dev_mode_from_args(args: argparse.Namespace) -> bool:
    """``--dev-mode``, else ``$HALCYON_DEV_MODE`` (1/true/yes/on or 0/false/no/off)."""
    if getattr(args, "dev_mode", None):
        return True
    text = os.environ.get(DEV_MODE_ENV, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise CredentialError(f"${DEV_MODE_ENV} must be 1 or 0, got {text!r}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_loopback_for_dev_mode(listen: str) -> None:
    """Refuse development mode on a listen address other machines can reach."""
    host = listen.rpartition(":")[0]
    if not is_loopback(host):
        raise CredentialError(
            f"--dev-mode accepts public credentials, so it listens on loopback only: got "
            f"--listen {listen}; use 127.0.0.1:PORT, or configure real credentials and drop "
            "--dev-mode"
        )


def _read_token_file(path: Path, kind: _Kind) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CredentialError(
            f"cannot read {kind.flag} {path}: {exc.strerror or exc}; "
            f"give a readable file holding the {kind.role} credential"
        ) from None
    except UnicodeDecodeError:
        raise CredentialError(f"{kind.flag} {path} is not UTF-8 text") from None
    return text.strip()


def _token(args: argparse.Namespace, kind: _Kind, *, required: bool, dev_mode: bool) -> str | None:
    path: Path | None = getattr(args, f"{kind.role}_token_file", None)
    if path is not None:
        token: str | None = _read_token_file(path, kind)
        source = f"{kind.flag} {path}"
        if not token:
            raise CredentialError(f"{source} is empty; put the {kind.role} credential in it")
    else:
        token = os.environ.get(kind.env, "").strip() or None
        source = f"${kind.env}"
    if token is None:
        if dev_mode:
            _log.warning(
                f"development mode: using the public dev {kind.role} credential",
                extra={"credential": str(kind.role)},
            )
            return kind.dev_token
        if required:
            raise CredentialError(
                f"no {kind.role} credential: pass {kind.flag} PATH or set ${kind.env} "
                "(or --dev-mode, loopback only, for the public development token)"
            )
        return None
    if any(c.isspace() or not c.isprintable() or not c.isascii() for c in token):
        raise CredentialError(
            f"the {kind.role} credential from {source} must be printable ASCII without spaces"
        )
    if token == kind.dev_token and not dev_mode:
        raise CredentialError(
            f"the {kind.role} credential from {source} is the public development token; "
            "configure a secret one, or pass --dev-mode (loopback only)"
        )
    return token


def load_credentials(
    args: argparse.Namespace, *, fleet_required: bool, operator_required: bool, listen: str
) -> Credentials:
    """The credentials the flags and environment give, or :class:`CredentialError`."""
    dev_mode = dev_mode_from_args(args)
    if dev_mode:
        require_loopback_for_dev_mode(listen)
    fleet = _token(args, _FLEET, required=fleet_required, dev_mode=dev_mode)
    operator = _token(args, _OPERATOR, required=operator_required, dev_mode=dev_mode)
    if fleet is not None and fleet == operator:
        raise CredentialError("the fleet and operator credentials must differ")
    return Credentials(fleet=fleet, operator=operator, dev_mode=dev_mode)
