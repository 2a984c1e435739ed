"""Where secrets come from: token files and the environment, never flags; dev mode on loopback."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from common.credentials import (
    DEV_FLEET_TOKEN,
    DEV_OPERATOR_TOKEN,
    CredentialError,
    Credentials,
    add_credential_arguments,
    is_loopback,
    load_credentials,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HALCYON_FLEET_TOKEN", "HALCYON_OPERATOR_TOKEN", "HALCYON_DEV_MODE"):
        monkeypatch.delenv(name, raising=False)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="halcyon test", exit_on_error=False)
    add_credential_arguments(parser, fleet_use="for tests", operator_use="for tests")
    return parser.parse_args(list(argv))


def load(args: argparse.Namespace, listen: str = "127.0.0.1:0") -> Credentials:
    return load_credentials(args, fleet_required=True, operator_required=True, listen=listen)


def test_token_files_are_read_and_stripped(tmp_path: Path) -> None:
    (tmp_path / "fleet").write_text("fleet-secret\n")
    (tmp_path / "op").write_text("  op-secret  \n")
    creds = load(
        parse("--fleet-token-file", str(tmp_path / "fleet"), "--operator-token-file",
              str(tmp_path / "op")),
        listen="0.0.0.0:50050",
    )  # fmt: skip
    assert (creds.fleet, creds.operator, creds.dev_mode) == ("fleet-secret", "op-secret", False)
    assert "secret" not in repr(creds)


def test_the_environment_works_and_a_file_wins_over_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HALCYON_FLEET_TOKEN", "from-env-fleet")
    monkeypatch.setenv("HALCYON_OPERATOR_TOKEN", "from-env-op")
    assert load(parse()).fleet == "from-env-fleet"
    (tmp_path / "fleet").write_text("from-file-fleet")
    assert load(parse("--fleet-token-file", str(tmp_path / "fleet"))).fleet == "from-file-fleet"


def test_no_credential_and_no_dev_mode_refuses_with_what_to_pass() -> None:
    with pytest.raises(CredentialError) as info:
        load(parse())
    message = str(info.value)
    assert "--fleet-token-file PATH" in message and "$HALCYON_FLEET_TOKEN" in message
    assert "--dev-mode" in message and "\n" not in message


def test_an_optional_operator_credential_may_be_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALCYON_FLEET_TOKEN", "f-secret")
    creds = load_credentials(parse(), fleet_required=True, operator_required=False, listen="h:1")
    assert creds.operator is None


def test_dev_mode_gives_the_public_tokens_on_loopback_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    creds = load(parse("--dev-mode"))
    assert (creds.fleet, creds.operator, creds.dev_mode) == (
        DEV_FLEET_TOKEN, DEV_OPERATOR_TOKEN, True,
    )  # fmt: skip
    monkeypatch.setenv("HALCYON_DEV_MODE", "1")
    assert load(parse(), listen="[::1]:50051").dev_mode
    for listen in ("0.0.0.0:50051", "10.1.2.3:1", "[::]:1", "example.com:1"):
        with pytest.raises(CredentialError, match="loopback only"):
            load(parse(), listen=listen)
    monkeypatch.setenv("HALCYON_DEV_MODE", "maybe")
    with pytest.raises(CredentialError, match="HALCYON_DEV_MODE"):
        load(parse())


def test_configured_credentials_win_in_dev_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALCYON_OPERATOR_TOKEN", "real-op")
    creds = load(parse("--dev-mode"))
    assert (creds.fleet, creds.operator) == (DEV_FLEET_TOKEN, "real-op")


def test_the_public_dev_token_is_refused_outside_dev_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HALCYON_FLEET_TOKEN", DEV_FLEET_TOKEN)
    monkeypatch.setenv("HALCYON_OPERATOR_TOKEN", "real-op")
    with pytest.raises(CredentialError, match="public development token"):
        load(parse())


@pytest.mark.parametrize("flag", ["--fleet-token", "--operator-token"])
def test_a_secret_on_the_command_line_is_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse(flag, "s3cret")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "visible to every local user in ps" in err and f"{flag}-file PATH" in err


def test_unusable_token_files_are_explained(tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match="cannot read --fleet-token-file"):
        load(parse("--fleet-token-file", str(tmp_path / "missing")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CredentialError, match="is empty"):
        load(parse("--fleet-token-file", str(tmp_path / "empty")))
    (tmp_path / "spaced").write_text("two words")
    with pytest.raises(CredentialError, match="without spaces"):
        load(parse("--fleet-token-file", str(tmp_path / "spaced")))


def test_one_secret_for_both_roles_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALCYON_FLEET_TOKEN", "same")
    monkeypatch.setenv("HALCYON_OPERATOR_TOKEN", "same")
    with pytest.raises(CredentialError, match="differ"):
        load(parse())


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.5.0.1", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.2", False),
     ("gateway", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
