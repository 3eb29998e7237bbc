"""`specdec load`'s PNG plots from its rows (specdec_tools.bench.load_report.LoadRow): throughput,
latency against throughput, TPOT p50/p99 and the throughput ratio, each against
concurrency, one line per (api, scenario), in the style of specdec_tools.bench.report."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from specdec_tools.bench.report import _save


def plots(rows: list, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_scenario: dict[str, list] = defaultdict(list)  # one line per (api, scenario)
    for r in sorted(rows, key=lambda r: r.concurrency):
        by_scenario[r.label].append(r)
    color = {name: f"C{i % 10}" for i, name in enumerate(by_scenario)}  # one per scenario
    files = []
    fig, ax = plt.subplots(figsize=(7, 6))
    for name, rs in by_scenario.items():
        ax.plot([r.concurrency for r in rs], [r.aggregate_tps for r in rs], "o-", label=name,
                color=color[name])
    _label(ax, "aggregate tokens/s", "throughput vs concurrency")
    files.append(_save(fig, out_dir / "throughput_vs_concurrency.png"))
    fig, ax = plt.subplots(figsize=(7, 6))
    for name, rs in by_scenario.items():
        rs = [r for r in rs if r.itl_p50_ms is not None]
        ax.plot([r.aggregate_tps for r in rs], [r.itl_p50_ms for r in rs], "o-", label=name,
                color=color[name])
        for r in rs:
            ax.annotate(f"N={r.concurrency}", (r.aggregate_tps, r.itl_p50_ms), fontsize=6)
    _label(ax, "inter-token latency p50 (ms)", "latency vs throughput", "aggregate tokens/s")
    files.append(_save(fig, out_dir / "itl_vs_throughput.png"))
    fig, ax = plt.subplots(figsize=(7, 6))
    for name, rs in by_scenario.items():
        rs = [r for r in rs if r.tpot_p50_ms is not None]
        if rs:
            ns = [r.concurrency for r in rs]
            ax.plot(ns, [r.tpot_p50_ms for r in rs], "o-", label=f"{name} p50",
                    color=color[name])
            ax.plot(ns, [r.tpot_p99_ms for r in rs], "o--", label=f"{name} p99",
                    color=color[name])
    _label(ax, "time per output token (ms)", "TPOT p50 and p99 vs concurrency")
    files.append(_save(fig, out_dir / "tpot_vs_concurrency.png"))
    ratios = {n: [r for r in rs if r.throughput_ratio is not None]
              for n, rs in by_scenario.items()}
    if any(ratios.values()):
        fig, ax = plt.subplots(figsize=(7, 6))
        for name, rs in ratios.items():
            if rs:
                ax.plot([r.concurrency for r in rs], [r.throughput_ratio for r in rs], "o-",
                        label=name, color=color[name])
        ax.axhline(1.0, color="grey", lw=0.8)
        _label(ax, "throughput ratio over its baseline", "throughput ratio vs concurrency")
        files.append(_save(fig, out_dir / "throughput_ratio_vs_concurrency.png"))
    return files


def _label(ax, ylabel: str, title: str, xlabel: str | None = None) -> None:
    """Axes labels and legend; without `xlabel`, x is the concurrency on a log2 scale."""
    if xlabel is None:
        from matplotlib.ticker import FormatStrFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))  # 1, 2, 4, not 2^0, 2^1
    ax.set_xlabel(xlabel or "concurrent streams N")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.14))  # below: no overlap
