"""``halcyon loadtest``'s report: gateway counters over the run, and how they are shown."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from halcyon.tools.loadtest import GatewayCounters, Tally, read_gateway_counters, render, summarize

METRICS = """\
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
# HELP halcyon_gateway_batch_size Requests per dispatched batch.
# TYPE halcyon_gateway_batch_size histogram
halcyon_gateway_batch_size_bucket{le="1.0"} 3.0
halcyon_gateway_batch_size_bucket{le="+Inf"} 10.0
halcyon_gateway_batch_size_count 10.0
halcyon_gateway_batch_size_sum 40.0
"""


@pytest.fixture
def metrics_address() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_reads_cpu_and_batches_from_the_gateway(metrics_address: str) -> None:
    assert read_gateway_counters(metrics_address) == GatewayCounters(12.5, 10.0, 40.0)


def test_unreachable_metrics_read_as_none() -> None:
    assert read_gateway_counters("127.0.0.1:1") is None


def test_counters_over_the_run_and_their_report() -> None:
    before = GatewayCounters(10.0, 100.0, 1000.0)
    after = GatewayCounters(10.5, 150.0, 1500.0)
    tally = Tally()
    for size in (20, 20, 10):
        tally.outcomes["OK"] += 1
        tally.latencies_ms.append(5.0)
        tally.added_ms.append(5.0)
        tally.batch_sizes.append(size)
    report = summarize(tally, 1.0, after.minus(before))
    assert report["gateway_cpu_ms_per_request"] == pytest.approx(500.0 / 3)
    assert report["gateway_batches"] == 50
    assert report["gateway_requests_per_batch"] == pytest.approx(10.0)
    text = render(report)
    assert "50 dispatched, 10.00 requests per batch" in text


def test_without_batch_metrics_only_cpu_is_reported() -> None:
    report = summarize(Tally(outcomes={"OK": 1}), 1.0, GatewayCounters(0.001))
    assert report["gateway_batches"] is None
    assert report["gateway_requests_per_batch"] is None
    assert "gateway batches" not in render(report)
