"""Seeded randomness.

Policy objects take an ``Rng`` so that every random choice (power-of-two-choices sampling,
jitter, hedge budgets) is reproducible from a seed. ``Mulberry32`` reproduces the 32-bit
generator the published benchmark workload was drawn with (JavaScript ``Math.imul``
semantics), so traces match the original bit for bit.
"""

from __future__ import annotations

import random
from typing import Protocol, runtime_checkable

_MASK32 = 0xFFFFFFFF


@runtime_checkable
class Rng(Protocol):
    """The randomness policy code may use: uniform floats in [0, 1) and bounded integers."""

    def random(self) -> float: ...

    def randrange(self, n: int) -> int: ...


class SeededRng:
    """``random.Random`` behind the ``Rng`` protocol; the default for policy objects."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def random(self) -> float:
        return self._r.random()

    def randrange(self, n: int) -> int:
        return self._r.randrange(n)


def _imul(a: int, b: int) -> int:
    """32-bit multiply with JavaScript ``Math.imul`` wrap-around, returned unsigned."""
    return (a * b) & _MASK32


class Mulberry32:
    """mulberry32: a tiny 32-bit PRNG, bit-exact with the JavaScript reference implementation."""

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK32

    def next_u32(self) -> int:
        self._state = (self._state + 0x6D2B79F5) & _MASK32
        t = self._state
        t = _imul(t ^ (t >> 15), t | 1)
        t ^= (t + _imul(t ^ (t >> 7), t | 61)) & _MASK32
        return (t ^ (t >> 14)) & _MASK32

    def random(self) -> float:
        return self.next_u32() / 4294967296.0

    def randrange(self, n: int) -> int:
        if n <= 0:
            raise ValueError("randrange needs n > 0")
        return int(self.random() * n)
