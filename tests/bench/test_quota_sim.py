"""``halcyon bench --scenario quotas``: deterministic, prints its tables, and the figures."""

from __future__ import annotations

import argparse
import io

import pytest

from bench import cli
from bench.quota_report import TARGETS, StrategyFigures, quotas_main, run_all
from bench.quota_world import default_scenario

SEED = cli.DEFAULT_SEED


def quick(seed: int) -> str:
    out = io.StringIO()
    assert quotas_main(seed, quick=True, out=out) == 0
    return out.getvalue()


def test_quick_run_prints_the_tables_and_is_deterministic() -> None:
    first = quick(SEED)
    assert first == quick(SEED)
    assert first != quick(SEED + 1)
    assert first.startswith("Quota benchmark — 8 gateways, 3 join and 3 crash")
    for strategy in ("full", "static", "leases", "ideal"):
        assert f"| {strategy} " in first
    assert "| strategy | tenant   | offered/contract |" in first
    assert "one character per 4 s" in first


def test_the_cli_dispatches_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    assert cli.run(parser.parse_args(["--scenario", "quotas", "--quick"])) == 0
    assert capsys.readouterr().out == quick(SEED)


@pytest.fixture(scope="module")
def default_run() -> dict[str, StrategyFigures]:
    return {r.strategy: r for r in run_all(default_scenario(), SEED)}


def test_leases_hold_the_fleet_to_the_contract(default_run: dict[str, StrategyFigures]) -> None:
    leases = default_run["leases"]
    assert leases.steady_error <= TARGETS["steady"]
    assert leases.overshoot <= TARGETS["overshoot"]
    assert max(t.peak for t in leases.tenants) <= 1.0 + TARGETS["overshoot"]
    # Today's per-gateway quota admits far over the contract; a static split refuses a lot.
    assert default_run["full"].steady_error > 0.3
    assert default_run["static"].refused_under > 10 * leases.refused_under_pooled


def test_leases_refuse_little_under_quota_demand_fleet_wide(
    default_run: dict[str, StrategyFigures],
) -> None:
    assert default_run["leases"].refused_under_pooled <= TARGETS["refused"]


@pytest.mark.xfail(
    strict=True,
    reason="umbrella (85 % of its contract, one client ~45 % of it) is refused ~4 % under "
    "quota: per-gateway demand noise exceeds the equal headroom (docs/benchmarks/quotas)",
)
def test_leases_refuse_little_under_quota_demand_for_every_tenant(
    default_run: dict[str, StrategyFigures],
) -> None:
    assert default_run["leases"].refused_under <= TARGETS["refused"]
