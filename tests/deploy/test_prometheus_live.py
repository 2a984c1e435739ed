"""A real Prometheus scrapes a real stack under load: every recording rule and every dashboard
query returns data, and the breaker alert fires when a worker fails every batch.

Processes: a controller, a healthy v1 worker, a v1 worker with ``--fail-rate 1``, a v2 worker
(the canary a rollout would judge), a gateway, ``halcyon loadtest`` at 40 req/s, and the
``prometheus`` server from Debian's package with deploy/prometheus/rules.yml, scraping every
process's /metrics each second and evaluating the rules each second.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from deploy_support import DEPLOY, e2e, free_port, require_tool  # type: ignore[import-not-found]

from halcyon.v1 import control_pb2
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

RULES = DEPLOY / "prometheus" / "rules.yml"
DASHBOARD = DEPLOY / "grafana" / "halcyon.json"
BREAKER_ALERT = "HalcyonReplicaBreakerOpen"
# Dashboard queries on the controller's rollout metrics have data only while a rollout runs.
ROLLOUT_METRIC = "halcyon_controller_rollout_"
FAST = ("--intercept-ms", "2", "--ms-per-token", "0", "--jitter", "0")


def recording_rules() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["record"] for g in groups for r in g["rules"] if "record" in r]


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read().decode())
    assert body["status"] == "success", body
    return body["data"]


class Prometheus:
    """The real server, on a loopback port, with its own data directory."""

    def __init__(self, workdir: Path, targets: dict[str, str]) -> None:
        binary = require_tool("prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": f"halcyon-{name}", "static_configs": [{"targets": [address]}]}
                for name, address in targets.items()
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def describe(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        def running() -> None:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.describe()}"

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)

        wait_until(
            ready, timeout_s, "prometheus to be ready", interval_s=0.2, transient=(OSError,),
            check=running, details=self.describe,
        )  # fmt: skip

    def query(self, expr: str) -> list[Any]:
        q = urllib.parse.urlencode({"query": expr})
        return list(_get(f"{self.url}/api/v1/query?{q}")["result"])

    def firing(self) -> set[str]:
        alerts = _get(f"{self.url}/api/v1/alerts")["alerts"]
        return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _start_rollout(fleet: Any) -> bool:
    """Start a rollout of v2 so the rollout metrics have series; False while the controller
    answers the rollout RPCs with UNIMPLEMENTED (before the rollout controller exists)."""
    try:
        fleet.control_stub.StartRollout(
            control_pb2.StartRolloutRequest(
                model=e2e.MODEL, canary_version="v2", step_percents=[50.0]
            ),
            metadata=(("authorization", f"Bearer {e2e.OPERATOR_TOKEN}"),),
            timeout=5,
        )
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            return False
        raise
    return True


@pytest.mark.timeout(240)
def test_rules_and_dashboard_have_data_and_the_breaker_alert_fires(
    launcher: Any, tmp_path: Path
) -> None:
    require_tool("promtool")  # the same package; fail early under CI if it is missing
    controller = launcher.controller()
    workers = {
        "replica-good": launcher.worker(controller, "replica-good", *FAST),
        "replica-bad": launcher.worker(controller, "replica-bad", *FAST, "--fail-rate", "1"),
        "replica-v2": launcher.worker(controller, "replica-v2", *FAST, "--version", "v2"),
    }
    gateway = launcher.gateway(controller)
    for proc in (*workers.values(), gateway):
        proc.wait_ready()
    fleet = e2e.Fleet(controller, workers, gateway)
    launcher.fleets.append(fleet)
    fleet.wait_converged()
    rollout = _start_rollout(fleet)

    load = subprocess.Popen(
        [
            *(sys.executable, "-m", "halcyon", "loadtest", "--target", gateway.grpc),
            *("--rate", "40", "--seconds", "90", "--json"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    targets = {
        "controller": controller.metrics,
        "gateway": gateway.metrics,
        **{name: proc.metrics for name, proc in workers.items()},
    }
    prometheus = Prometheus(tmp_path, targets)
    try:
        prometheus.wait_ready()
        records = recording_rules()
        queries = dashboard_queries()
        # Every rule and every query (the rollout ones once the controller runs rollouts).
        needed = records + [q for q in queries if rollout or ROLLOUT_METRIC not in q]
        missing: list[str] = list(dict.fromkeys(needed))
        deadline = time.monotonic() + 60.0
        fired = False
        while (missing or not fired) and time.monotonic() < deadline:
            assert load.poll() is None, "the load generator stopped early"
            missing = [q for q in missing if not prometheus.query(q)]
            fired = fired or BREAKER_ALERT in prometheus.firing()
            time.sleep(1.0)
        assert not missing, (
            "these queries returned no data from a live stack under load:\n"
            + "\n".join(missing)
            + "\n"
            + "\n".join(p.describe() for p in fleet.live())
        )
        assert fired, f"{BREAKER_ALERT} did not fire: {prometheus.query('ALERTS')}"
        # The alert names the failing replica, not the healthy ones.
        [alert] = [
            a["metric"]
            for a in prometheus.query(f'ALERTS{{alertname="{BREAKER_ALERT}",alertstate="firing"}}')
        ]
        assert alert["replica"] == "replica-bad"
        # Goodput was measured (the gateway retried the bad replica's batches elsewhere).
        [ratio] = prometheus.query("halcyon:gateway_goodput:ratio_rate5m")
        assert float(ratio["value"][1]) > 0.5
        if not rollout:
            # Until the rollout controller exists, its metrics are declared (and scraped) but
            # have no series; the queries above covered everything else.
            metadata = _get(
                f"{prometheus.url}/api/v1/targets/metadata?match_target="
                + urllib.parse.quote('{job="halcyon-controller"}')
            )
            names = {m["metric"] for m in metadata}
            for q in queries:
                if ROLLOUT_METRIC in q:
                    assert any(n in q for n in names if n.startswith(ROLLOUT_METRIC)), q
    finally:
        load.terminate()
        load.wait(timeout=10)
        prometheus.stop()
