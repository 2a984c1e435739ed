"""Argument types for the ``halcyon`` subcommands: a bad flag is refused with a clear message.

What it decides: how a command-line value is checked, once, for every process — so
``--speed 0`` or ``--controller nohost`` fails at parse time with argparse's usage line
instead of deep inside a server.
"""

from __future__ import annotations

import argparse
import math

from common.serving import parse_hostport

__all__ = ["hostport", "non_negative", "positive", "probability"]


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def non_negative(text: str) -> float:
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def probability(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a probability in [0, 1]")
    return value


def hostport(text: str) -> str:
    try:
        parse_hostport(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
