"""Several gateways: the stack's consecutive ports, and loadtest's per-gateway channels."""

from __future__ import annotations

from collections import Counter

from halcyon.tools.loadtest_driver import LoadGenerator
from halcyon.tools.loadtest_mix import LoadOptions, split_targets
from halcyon.tools.loadtest_report import render, summarize
from halcyon.tools.loadtest_tally import Tally
from halcyon.tools.stack_layout import gateway_name, nth_address


def test_gateways_take_consecutive_ports_and_names() -> None:
    assert [nth_address("127.0.0.1:50051", i) for i in range(3)] == [
        "127.0.0.1:50051",
        "127.0.0.1:50052",
        "127.0.0.1:50053",
    ]
    assert nth_address("127.0.0.1:0", 2) == "127.0.0.1:0"  # any free port, each its own
    assert [gateway_name(i) for i in range(3)] == ["gateway", "gateway-2", "gateway-3"]


def test_targets_split_unless_grpc_balances_them() -> None:
    assert split_targets("127.0.0.1:50051") == ["127.0.0.1:50051"]
    assert split_targets("127.0.0.1:50051,127.0.0.1:50052") == [
        "127.0.0.1:50051",
        "127.0.0.1:50052",
    ]
    assert split_targets("ipv4:127.0.0.1:50051,127.0.0.1:50052") == [
        "ipv4:127.0.0.1:50051,127.0.0.1:50052"
    ]


def test_the_report_counts_requests_per_target_only_with_several() -> None:
    one = summarize(Tally(outcomes=Counter(OK=3)), 1.0, None)
    assert "targets" not in one and "target " not in render(one)
    tally = Tally(
        outcomes=Counter(OK=3),
        by_target=Counter({"a:1": 2, "b:2": 1}),
        ok_by_target=Counter({"a:1": 2, "b:2": 1}),
    )
    report = summarize(tally, 1.0, None)
    assert report["targets"] == {"a:1": {"requests": 2, "ok": 2}, "b:2": {"requests": 1, "ok": 1}}
    assert "a:1: 2 requests, 2 successful" in render(report)


def test_each_target_gets_its_channel() -> None:
    gen = LoadGenerator(LoadOptions(target="127.0.0.1:1,127.0.0.1:2", clients=4))
    try:
        assert gen.targets == ["127.0.0.1:1", "127.0.0.1:2"] and len(gen.calls) == 2
        assert gen.tally.by_target == Counter({"127.0.0.1:1": 0, "127.0.0.1:2": 0})
    finally:
        gen.close()
