"""deploy/prometheus and deploy/grafana, checked offline: promtool validates the rules and runs
their unit tests on synthetic series; every alert has such a test; the dashboard's queries
parse and name only recording rules that exist (tests/deploy/test_prometheus_live.py runs
them all against a live stack)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from deploy_support import DEPLOY, require_tool  # type: ignore[import-not-found]

PROMETHEUS = DEPLOY / "prometheus"
RULES = PROMETHEUS / "rules.yml"
TESTS = PROMETHEUS / "tests.yml"
DASHBOARD = DEPLOY / "grafana" / "halcyon.json"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=PROMETHEUS,
    )


def test_promtool_checks_the_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = _promtool("test", "rules", str(TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_that_expects_it_to_fire() -> None:
    alerts = {
        r["alert"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    tested = {
        case["alertname"]
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == tested, f"alerts with no firing test: {sorted(alerts - tested)}"


def test_every_dashboard_query_parses_and_reads_known_series(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    records = {
        r["record"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p.get("targets") for p in panels)
    exprs = []
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            exprs.append(expr)
            names = re.findall(r"\b(halcyon[:_][a-z0-9_:]+)", expr)
            assert names, f"{panel['title']}: {expr} reads no Halcyon series"
            for name in names:
                if ":" in name:
                    assert name in records, f"{panel['title']}: no recording rule {name}"
    # promtool has no query linter: a throwaway rule file makes it parse every query.
    check = tmp_path / "dashboard-queries.yml"
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    check.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _promtool("check", "rules", str(check))
    assert result.returncode == 0, result.stdout + result.stderr
