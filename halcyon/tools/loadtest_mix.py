"""``halcyon loadtest``'s request mix and options: what load one run offers.

SLO classes (``--mix``, :class:`SloClass`, :func:`parse_mix`), the request shapes (max output
tokens and prompt sizes, :func:`parse_range`; prompts of 4 to 16 words by default) serialized
once up front by :func:`_request_pool`, and :class:`LoadOptions`, the flags' fields with the
flags' defaults and the command line's refusals (:meth:`LoadOptions.problem`). Kept apart from
the driver so a sweep or a test can build and check a run's shape without a channel.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, fields

from halcyon.tools.loadtest_slo import Objective
from halcyon.v1 import infer_pb2

DEFAULT_MAX_TOKENS = (64, 255)
MAX_INPUT_BYTES = 64 * 1024  # the gateway's limit on InferRequest.input


@dataclass(frozen=True)
class SloClass:
    """One class of the ``--mix``: its name, its share of requests, its deadline."""

    name: str
    share: float
    deadline_ms: float


def parse_mix(text: str) -> tuple[SloClass, ...]:
    """``NAME:SHARE:DEADLINE_MS[,...]`` (e.g. ``urgent:0.3:800,relaxed:0.7:6000``); shares are
    positive and normalised to sum to 1 (raises ValueError)."""
    classes: list[SloClass] = []
    for part in text.split(","):
        bits = part.strip().split(":")
        if len(bits) != 3 or not bits[0]:
            raise ValueError(f"not NAME:SHARE:DEADLINE_MS: {part.strip()!r}")
        name = bits[0]
        try:
            share, deadline_ms = float(bits[1]), float(bits[2])
        except ValueError:
            raise ValueError(f"not NAME:SHARE:DEADLINE_MS: {part.strip()!r}") from None
        if not (share > 0 and math.isfinite(share)):
            raise ValueError(f"class {name!r}: the share must be positive, got {bits[1]}")
        if not (deadline_ms > 0 and math.isfinite(deadline_ms)):
            raise ValueError(f"class {name!r}: the deadline must be positive, got {bits[2]}")
        if any(c.name == name for c in classes):
            raise ValueError(f"class {name!r} given twice")
        classes.append(SloClass(name, share, deadline_ms))
    total = sum(c.share for c in classes)
    return tuple(SloClass(c.name, c.share / total, c.deadline_ms) for c in classes)


def parse_range(text: str) -> tuple[int, int]:
    """``LO:HI`` as two integers with 1 <= LO <= HI (raises ValueError)."""
    lo_text, sep, hi_text = text.partition(":")
    try:
        lo, hi = int(lo_text), int(hi_text)
    except ValueError:
        raise ValueError(f"not LO:HI: {text!r}") from None
    if not sep or lo < 1 or hi < lo:
        raise ValueError(f"not LO:HI with 1 <= LO <= HI: {text!r}")
    return lo, hi


_WORDS = ["summarise", "the", "quarterly", "report", "for", "our", "fleet", "please"]


def _prompt(rng: random.Random, input_bytes: tuple[int, int] | None) -> str:
    if input_bytes is None:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16)))
    size = rng.randint(*input_bytes)
    text = ""
    while len(text) < size:
        text += rng.choice(_WORDS) + " "
    return text[:size]


def _request_pool(
    model: str,
    session: str,
    rng: random.Random,
    size: int = 32,
    max_tokens: tuple[int, int] = DEFAULT_MAX_TOKENS,
    input_bytes: tuple[int, int] | None = None,
) -> list[bytes]:
    pool = []
    for _ in range(size):
        prompt = _prompt(rng, input_bytes)
        req = infer_pb2.InferRequest(
            model=model,
            input=prompt,
            max_output_tokens=rng.randint(*max_tokens),
            session_key=session,
        )
        pool.append(req.SerializeToString())
    return pool


_SCHEMES = ("ipv4:", "ipv6:", "dns:", "unix:", "unix-abstract:", "vsock:", "xds:")


def split_targets(target: str) -> list[str]:
    """``--target``'s gateways: ``A,B`` is two, each with its own channel (clients spread round
    robin over them); a gRPC target with a scheme (``ipv4:A,B``) stays one channel, balanced by
    gRPC itself (``--health-check``)."""
    if target.startswith(_SCHEMES) or "," not in target:
        return [target]
    return [part.strip() for part in target.split(",") if part.strip()]


@dataclass
class LoadOptions:
    """What one load test does: the ``halcyon loadtest`` flags, with the same defaults."""

    target: str = "127.0.0.1:50051"
    api_key: str = "demo-key-premium"
    model: str = "llama-3-8b"
    clients: int = 32
    rate: float = 0.0  # > 0: open loop at this many arrivals per second
    seconds: float = 20.0
    deadline_ms: float = 2000.0
    max_inflight: int = 4096
    seed: int = 1
    honor_retry_info: bool = False
    retry_immediately: bool = False
    health_check: str | None = None
    connect_timeout: float = 10.0
    gateway_metrics: str | None = None
    worker_metrics: Sequence[str] | None = None
    mix: Sequence[SloClass] | None = None  # None: one class with deadline_ms
    max_tokens: tuple[int, int] | None = None  # None: DEFAULT_MAX_TOKENS
    input_bytes: tuple[int, int] | None = None  # None: 4 to 16 words
    # Objectives the command judges the run on (judge(slo, result.latencies_ms, result.report));
    # run_loadtest itself only measures.
    slo: Sequence[Objective] | None = None
    json: bool = False
    progress: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadOptions:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})

    @property
    def classes(self) -> tuple[SloClass, ...]:
        return tuple(self.mix) if self.mix else (SloClass("default", 1.0, self.deadline_ms),)

    @property
    def mode(self) -> str:
        mode = f"open loop {self.rate:g} req/s" if self.rate else f"{self.clients} clients"
        if self.mix:
            mode += ", mix " + ",".join(f"{c.name}:{c.share:g}:{c.deadline_ms:g}" for c in self.mix)
        if self.health_check is not None:
            mode += f", round_robin on health of {self.health_check!r}"
        if self.honor_retry_info:
            mode += ", honouring retry advice"
        elif self.retry_immediately:
            mode += ", retrying immediately"
        return mode

    def problem(self) -> str | None:
        """Why these options cannot run (the command line's wording), or None."""
        if self.clients < 1 and not self.rate:
            return "--clients must be at least 1 (or give --rate)"
        if self.rate < 0:
            return "--rate must be positive (or leave it out for a closed loop)"
        if self.seconds <= 0:
            return "--seconds must be positive"
        if self.deadline_ms <= 0:
            return "--deadline-ms must be positive"
        if self.honor_retry_info and self.retry_immediately:
            return "--honor-retry-info and --retry-immediately exclude each other"
        if self.input_bytes is not None and self.input_bytes[1] > MAX_INPUT_BYTES:
            return f"--input-bytes: at most {MAX_INPUT_BYTES} bytes (the gateway's limit)"
        return None
