"""Command-line value checks refuse bad input with argparse's own error."""

from __future__ import annotations

import argparse

import pytest

from common.argtypes import hostport, non_negative, positive, probability


@pytest.mark.parametrize(
    ("check", "bad"),
    [
        (positive, "0"),
        (positive, "-1"),
        (positive, "inf"),
        (positive, "nan"),
        (positive, "fast"),
        (non_negative, "-0.1"),
        (probability, "1.5"),
        (probability, "-0.01"),
        (hostport, "nohost"),
        (hostport, "host:notaport"),
    ],
)
def test_refuses(check: object, bad: str) -> None:
    assert callable(check)
    with pytest.raises(argparse.ArgumentTypeError):
        check(bad)


def test_accepts() -> None:
    assert positive("0.5") == 0.5
    assert non_negative("0") == 0.0
    assert probability("1") == 1.0
    assert hostport("127.0.0.1:0") == "127.0.0.1:0"
