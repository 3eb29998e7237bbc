"""Turn benchmark samples into figures: per-scenario rows, JSON, Markdown, PNG plots."""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdec.verify import TokenKind
from specdec_tools.bench import harness
from specdec_tools.bench.harness import Sample
from specdec_tools.bench.system import BASELINE

__all__ = ["BASELINE", "Row", "markdown", "plots", "rounds_from_kinds", "summarise",
           "write_json"]


@dataclass
class Row:
    scenario: str
    temperature: float
    k: int | None
    samples: int
    tokens_per_s: float  # median over prompts x repeats
    tokens_per_s_min: float
    tokens_per_s_max: float
    speedup: float | None  # harness.SPEEDUP_DEFINITION
    ttft_ms: float | None
    alpha: float | None = None  # per-token acceptance
    mean_accepted: float | None = None  # accepted drafts per round
    acceptance_by_position: list[float] = field(default_factory=list)
    cost_ratio_c: float | None = None  # t_draft(1) / t_target(1)
    verify_cost_ratio: float | None = None  # t_target(K+1) / t_target(1)
    bound: float | None = None  # Leviathan et al., from the measured values
    efficiency: float | None = None  # speedup / bound
    wire_bytes_per_round: float | None = None
    coordinator_overhead_ms_per_round: float | None = None
    exact: bool | None = None  # greedy: ids == target-only ids (specdec, and peers')
    system: bool = False  # specdec through its services (a peer otherwise)


def k_of(name: str) -> int | None:
    m = re.search(r"K=(\d+)", name)
    return int(m.group(1)) if m else None


def rounds_from_kinds(kinds: list[int]) -> list[int]:
    """Accepted drafts per round, read off the token kinds (each round ends in a
    recovered or bonus token)."""
    out, run = [], 0
    for kind in kinds:
        if kind == TokenKind.ACCEPTED:
            run += 1
        elif kind in (TokenKind.RECOVERED, TokenKind.BONUS):
            out.append(run)
            run = 0
    return out


def summarise(samples: list[Sample], temperature: float) -> list[Row]:
    by_scenario: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_scenario[s.scenario].append(s)
    base_by_prompt: dict[str, list[Sample]] = defaultdict(list)
    for s in by_scenario.get(BASELINE, []):
        base_by_prompt[s.prompt].append(s)
    t1_calls = [v for s in by_scenario.get(BASELINE, []) for v in s.verify_s]
    t1 = statistics.median(t1_calls) if t1_calls else None  # one target step, via RPC
    rows = []
    for name, group in by_scenario.items():
        tps = [s.tokens_per_s for s in group]
        ttfts = [s.ttft for s in group if s.ttft is not None]
        row = Row(name, temperature, k_of(name), len(group), statistics.median(tps), min(tps),
                  max(tps), harness.speedup(samples, name, BASELINE),
                  1000 * statistics.median(ttfts) if ttfts else None)
        k = row.k
        row.system = bool(group[0].kinds)
        if row.system and k:
            _speculative_figures(row, group, k, t1)
        # Greedy: specdec's texts and every peer's that reports its ids must equal
        # target-only's; a peer's that does not continued something else.
        if (row.system or group[0].token_ids) and temperature == 0 and base_by_prompt:
            row.exact = all(s.token_ids == base_by_prompt[s.prompt][0].token_ids
                            for s in group if s.prompt in base_by_prompt)
        rows.append(row)
    return rows


def _speculative_figures(row: Row, group: list[Sample], k: int, t1: float | None) -> None:
    per_round = [n for s in group for n in rounds_from_kinds(s.kinds)]
    kinds = [kd for s in group for kd in s.kinds]
    accepted = kinds.count(TokenKind.ACCEPTED)
    rejected = kinds.count(TokenKind.RECOVERED)
    a = accepted / max(accepted + rejected, 1)
    row.alpha = a
    row.mean_accepted = statistics.mean(per_round) if per_round else 0.0
    row.acceptance_by_position = [sum(n > i for n in per_round) / max(len(per_round), 1)
                                  for i in range(k)]
    rounds = sum(s.rounds for s in group)
    row.wire_bytes_per_round = sum(s.wire_bytes for s in group) / max(rounds, 1)
    rpc = sum(sum(s.propose_s) + sum(s.verify_s) for s in group)
    row.coordinator_overhead_ms_per_round = \
        1000 * (sum(s.seconds for s in group) - rpc) / max(rounds, 1)
    proposes = [p for s in group for p in s.propose_s]
    verifies = [v for s in group for v in s.verify_s]
    if t1 and proposes and verifies:
        c = statistics.median(proposes) / k / t1
        v = statistics.median(verifies) / t1
        row.cost_ratio_c, row.verify_cost_ratio = c, v
        expected = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
        row.bound = expected / (k * c + v)
        if row.speedup:
            row.efficiency = row.speedup / row.bound


def _fmt(x, spec=".2f", suffix="") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def table(rows: list[Row]) -> list[str]:
    """The Markdown table of these rows (one temperature)."""
    out = ["| scenario | tok/s (min-max) | speedup | TTFT ms | alpha | accepted/round | "
           "c | t(K+1)/t(1) | bound | efficiency | bytes/round | overhead ms/round | "
           "exact |", "|" + "---|" * 13]
    for r in rows:
        out.append(
            f"| {r.scenario} | {r.tokens_per_s:.1f} ({r.tokens_per_s_min:.1f}-"
            f"{r.tokens_per_s_max:.1f}) | {_fmt(r.speedup, '.2f', 'x')} | "
            f"{_fmt(r.ttft_ms, '.0f')} | {_fmt(r.alpha)} | {_fmt(r.mean_accepted)} | "
            f"{_fmt(r.cost_ratio_c)} | {_fmt(r.verify_cost_ratio)} | "
            f"{_fmt(r.bound, '.2f', 'x')} | {_fmt(r.efficiency)} | "
            f"{_fmt(r.wire_bytes_per_round, '.0f')} | "
            f"{_fmt(r.coordinator_overhead_ms_per_round, '.1f')} | "
            f"{'-' if r.exact is None else ('yes' if r.exact else 'NO')} |")
    return out


def notes(meta: dict) -> list[str]:
    """Failed peers and peak RSS, one line each."""
    out = [f"Failed and skipped: {key}: {error}"
           for key, error in (meta.get("failed") or {}).items()]
    if meta.get("peak_rss_mb"):
        out.append("Peak RSS: " + ", ".join(f"{k} {v:.0f} MB"
                                            for k, v in meta["peak_rss_mb"].items()))
    return out


def markdown(rows: list[Row], meta: dict) -> str:
    out = [f"Machine: {meta.get('machine', '?')}. Model: {meta.get('model', '?')}. "
           f"{meta.get('prompts')} prompts x {meta.get('max_new_tokens')} new tokens, "
           f"{meta.get('repeats')} repeats, interleaved; medians (min-max). "
           f"{meta.get('speedup_definition', harness.SPEEDUP_DEFINITION)}.", ""]
    for temperature in sorted({r.temperature for r in rows}):
        out += [f"### temperature {temperature}", ""]
        out += table([r for r in rows if r.temperature == temperature])
        out.append("")
    out += notes(meta)
    return "\n".join(out) + "\n"


def load_json(path: Path) -> tuple[list[Row], dict]:
    """(rows, meta) of a bench.json."""
    data = json.loads(Path(path).read_text())
    return [Row(**r) for r in data["rows"]], data["meta"]


def write_json(path: Path, rows: list[Row], meta: dict) -> None:
    path.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))


def plots(rows: list[Row], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    greedy = [r for r in rows if r.temperature == 0]
    spec = sorted([r for r in greedy if r.k and r.speedup is not None and r.alpha is not None
                   and "pipelined" not in r.scenario],
                  key=lambda r: r.k)
    if spec:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r.k for r in spec], [r.speedup for r in spec], "o-", label="measured")
        ax.plot([r.k for r in spec if r.bound], [r.bound for r in spec if r.bound], "s--",
                label="Leviathan bound (measured a, c)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("K (draft tokens per round)")
        ax.set_ylabel("speedup over target-only")
        ax.set_title("specdec speedup vs K (greedy)")
        ax.legend()
        files.append(_save(fig, out_dir / "speedup_vs_k.png"))
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in spec:
            ax.plot(range(1, r.k + 1), r.acceptance_by_position, "o-", label=f"K={r.k}")
        ax.set_xlabel("draft position")
        ax.set_ylabel("fraction of rounds accepting it")
        ax.set_ylim(0, 1.02)
        ax.set_title("acceptance by draft position (greedy)")
        ax.legend()
        files.append(_save(fig, out_dir / "acceptance_by_position.png"))
    if greedy:
        import textwrap

        # peers' names run long ("... [same machine: all cores, default threads]")
        names = [textwrap.fill(r.scenario, 50) for r in greedy]
        lines = sum(n.count("\n") + 1 for n in names)
        fig, ax = plt.subplots(figsize=(11, 0.3 * lines + 0.2 * len(greedy) + 1.5))
        ax.barh(names, [r.tokens_per_s for r in greedy],
                xerr=[[r.tokens_per_s - r.tokens_per_s_min for r in greedy],
                      [r.tokens_per_s_max - r.tokens_per_s for r in greedy]])
        ax.set_xlabel("tokens/s (median, min-max)")
        ax.set_title("tokens/s per scenario (greedy)")
        ax.invert_yaxis()
        files.append(_save(fig, out_dir / "tokens_per_s.png"))
    return files


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
