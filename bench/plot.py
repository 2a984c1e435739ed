"""The benchmark's picture: goodput and p99 latency against offered load, per strategy.

What it decides: nothing about scheduling — how results are drawn. Two panels share the load
axis; goodput shows who keeps serving in time as load passes capacity, p99 shows what the
requests that were served paid for it. matplotlib is imported only when a plot is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.sim import SimResult


def plot_results(results: Sequence[SimResult], path: str, *, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies: list[str] = []
    for r in results:
        if r.strategy not in strategies:
            strategies.append(r.strategy)
    fig, (ax_good, ax_p99) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in strategies:
        rows = sorted((r for r in results if r.strategy == name), key=lambda r: r.rate)
        rates = [r.rate for r in rows]
        style = {"linewidth": 2.6, "zorder": 3} if name.startswith("halcyon") else {}
        ax_good.plot(rates, [r.goodput_per_s for r in rows], marker="o", label=name, **style)
        ax_p99.plot(rates, [r.p99_ms for r in rows], marker="o", label=name, **style)
    top = max(r.rate for r in results)
    ax_good.plot([0, top], [0, top], color="grey", linestyle=":", linewidth=1, label="offered")
    ax_good.set_xlabel("offered load (requests/s)")
    ax_good.set_ylabel("goodput (on-time requests/s)")
    ax_good.set_title("goodput")
    ax_p99.set_xlabel("offered load (requests/s)")
    ax_p99.set_ylabel("p99 latency of served requests (ms)")
    ax_p99.set_yscale("log")
    ax_p99.set_title("p99 latency")
    for ax in (ax_good, ax_p99):
        ax.grid(True, alpha=0.3)
    ax_good.legend(fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
