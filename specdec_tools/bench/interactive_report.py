"""The figures of `specdec bench --interactive` (specdec_tools.bench.interactive): per kind
of prompt, each variant's speedup (section 12's definition), the best fixed K and the
server's K against it; the load sweep's ratios beside GenAI's continuous batching; JSON,
Markdown and a plot."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from specdec_tools.bench.harness import SPEEDUP_DEFINITION

SPEEDUP = SPEEDUP_DEFINITION
BASE, SERVER = "K=0", "server"
GAIN = 1.2  # a fixed K that gains this much means the server's K should have drafted
GENAI_PLAIN = "OpenVINO GenAI continuous batching plain"
LLAMACPP_PLAIN = "llama.cpp server plain"


def _pairs(rows: list[dict]) -> dict:
    """(kind, prompt, repeat) -> {variant: row}."""
    out: dict = defaultdict(dict)
    for r in rows:
        out[(r["kind"], r["prompt"], r["repeat"])][r["variant"]] = r
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarise(rows: list[dict]) -> dict:
    """{kind: {"variants": {variant: figures}, "best_fixed": variant, "server_over_best":
    x, "idle_server": [prompts]}}."""
    pairs = _pairs(rows)
    out: dict = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        groups = [g for (k, _, _), g in pairs.items() if k == kind and BASE in g]
        variants = sorted(dict.fromkeys(r["variant"] for r in rows if r["kind"] == kind),
                          key=lambda v: (0, 1) if v == SERVER else (int(v[2:]) > 0, int(v[2:])))
        figures = {}
        for v in variants:
            got = [g[v] for g in groups if v in g and not g[v]["error"]]
            drafted = sum(r["drafted"] for r in got)
            figures[v] = {
                "speedup": _median([g[v]["tok_s"] / g[BASE]["tok_s"] for g in groups
                                    if v in g and g[BASE]["tok_s"] > 0]),
                "tok_s": _median([r["tok_s"] for r in got]),
                "acceptance": sum(r["accepted"] for r in got) / drafted if drafted else None,
                "mean_k": _median([r["mean_k"] for r in got]),
                "drafts_per_round": _median([r.get("drafts_per_round", 0.0) for r in got]),
                "drafted_nothing": sum(1 for r in got if r["drafted"] == 0),
                # the target service's own mean pass, where the run could read it
                "target_pass_ms": _median([r["target_pass_ms"] for r in got
                                           if r.get("target_pass_ms") is not None]),
                "requests": len(got)}
        fixed = [v for v in variants if v not in (BASE, SERVER)
                 and figures[v]["speedup"] is not None]
        best = max(fixed, key=lambda v: figures[v]["speedup"]) if fixed else None
        server = figures.get(SERVER, {}).get("speedup")
        idle = [f"{p}#{r}" for (k, p, r), g in pairs.items() if k == kind and SERVER in g
                and g[SERVER]["drafted"] == 0 and any(
                    g[v]["tok_s"] >= GAIN * g[BASE]["tok_s"] for v in fixed if v in g)]
        out[kind] = {"variants": figures, "best_fixed": best,
                     "server_over_best": server / figures[best]["speedup"]
                     if best and server else None,
                     "idle_server": idle,
                     "reasons": sorted({g[SERVER]["reason"] for (k, _, _), g in pairs.items()
                                        if k == kind and SERVER in g and g[SERVER]["reason"]})}
    return out


def mismatches(rows: list[dict]) -> list[str]:
    """Greedy outputs that differ from target-only's for the same prompt and repeat."""
    bad = []
    for (kind, prompt, repeat), g in _pairs(rows).items():
        base = g.get(BASE)
        for v, r in g.items():
            if base and v != BASE and not r["error"] and r["token_ids"] != base["token_ids"]:
                bad.append(f"{kind}/{prompt}#{repeat} {v}")
    return bad


def load_table(load_rows: list) -> list[dict]:
    """Per N: target-only and the server's K through the system, and GenAI plain."""
    by = defaultdict(dict)
    for r in load_rows:
        by[r.concurrency][r.scenario] = r
    out = []
    for n in sorted(by):
        row = by[n]
        base = next((r for s, r in row.items() if r.api and r.baseline is None), None)
        spec = next((r for s, r in row.items() if r.api and r.baseline is not None), None)
        genai = next((r for s, r in row.items() if s.startswith(GENAI_PLAIN)), None)
        llama = next((r for s, r in row.items() if s.startswith(LLAMACPP_PLAIN)), None)
        out.append({
            "concurrency": n,
            "target_only_tps": base.aggregate_tps if base else None,
            "server_tps": spec.aggregate_tps if spec else None,
            "ratio": spec.throughput_ratio if spec else None,
            "mean_k": spec.mean_k if spec else None,
            "genai_plain_tps": genai.aggregate_tps if genai else None,
            "over_genai": spec.aggregate_tps / genai.aggregate_tps
            if spec and genai and genai.aggregate_tps else None,
            "llamacpp_plain_tps": llama.aggregate_tps if llama else None,
            "over_llamacpp": spec.aggregate_tps / llama.aggregate_tps
            if spec and llama and llama.aggregate_tps else None,
            "mismatches": spec.mismatches if spec else None})
    return out


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown(summary: dict, load: list[dict], meta: dict) -> str:
    lines = ["# specdec bench --interactive", "",
             f"- **Command:** `{meta['command']}` ({meta['date']})",
             f"- **Machine:** {meta['machine']}",
             f"- **Coordinator:** {meta.get('coordinator', '-')}",
             f"- **Prompts:** the {meta['prompt_set']} set of "
             "specdec_tools.bench.interactive_prompts, "
             f"{meta['max_new_tokens']} new tokens, greedy, {meta['repeats']} repeat(s)",
             f"- **Speedup:** {SPEEDUP}", ""]
    for kind, s in summary.items():
        v = s["variants"]
        best = v[s["best_fixed"]]["speedup"] if s["best_fixed"] else None
        lines += [f"## {kind}: one request at a time", "",
                  f"server's K: **{_f(v.get(SERVER, {}).get('speedup'))}x**; best fixed "
                  f"{s['best_fixed']}: {_f(best)}x; "
                  f"server / best fixed: **{_f(s['server_over_best'])}**; server requests "
                  f"that drafted nothing where a fixed K gained {GAIN}x or more: "
                  f"{len(s['idle_server'])}", "",
                  "| variant | speedup | tok/s | acceptance | mean K | drafts / round | "
                  "target pass, ms | drafted nothing |", "|---|---|---|---|---|---|---|---|"]
        for name, f in v.items():
            lines.append(f"| {name} | {_f(f['speedup'])}x | {_f(f['tok_s'], '{:.1f}')} | "
                         f"{_f(f['acceptance'])} | {_f(f['mean_k'])} | "
                         f"{_f(f['drafts_per_round'])} | "
                         f"{_f(f.get('target_pass_ms'), '{:.1f}')} | "
                         f"{f['drafted_nothing']} of {f['requests']} |")
        if s["reasons"]:
            lines += ["", "Why the server's K was 0 in some rounds: " + "; ".join(
                s["reasons"][:6])]
        lines.append("")
    if load:
        lines += ["## Under load (general prompts, aggregate steady-state tok/s)", "",
                  "| N | target-only | server's K | ratio | mean K | GenAI CB plain, target "
                  "core | server / GenAI | llama.cpp plain, target core | server / "
                  "llama.cpp | mismatches |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in load:
            lines.append(f"| {r['concurrency']} | {_f(r['target_only_tps'], '{:.1f}')} | "
                         f"{_f(r['server_tps'], '{:.1f}')} | {_f(r['ratio'])}x | "
                         f"{_f(r['mean_k'])} | {_f(r['genai_plain_tps'], '{:.1f}')} | "
                         f"{_f(r['over_genai'])}x | "
                         f"{_f(r.get('llamacpp_plain_tps'), '{:.1f}')} | "
                         f"{_f(r.get('over_llamacpp'))}x | {_f(r['mismatches'], '{}')} |")
        lines.append("")
    return "\n".join(lines)


def plot(summary: dict, load: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for kind, s in summary.items():
        v = s["variants"]
        ks = sorted(int(n[2:]) for n in v if n.startswith("K="))
        line, = ax.plot(ks, [v[f"K={k}"]["speedup"] for k in ks], marker="o", label=kind)
        if v.get(SERVER, {}).get("speedup"):
            ax.axhline(v[SERVER]["speedup"], color=line.get_color(), linestyle="--",
                       label=f"{kind}: server's K")
    ax.set(xlabel="fixed K", ylabel="speedup over target-only",
           title="one request at a time")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.legend(fontsize=7)
    ax = axes[1]
    if load:
        ns = [r["concurrency"] for r in load]
        ax.plot(ns, [r["ratio"] for r in load], marker="o", label="server's K / target-only")
        ax.plot(ns, [r["over_genai"] for r in load], marker="s",
                label="server's K / GenAI CB plain (target core)")
        if any(r.get("over_llamacpp") for r in load):
            ax.plot(ns, [r.get("over_llamacpp") for r in load], marker="^",
                    label="server's K / llama.cpp server plain (target core)")
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.legend(fontsize=7)
    ax.set(xlabel="concurrent streams", ylabel="throughput ratio", title="under load")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(rows: list[dict], load_rows: list, meta: dict, out: Path) -> tuple[str, list[Path]]:
    summary, load = summarise(rows), load_table(load_rows)
    md = markdown(summary, load, meta)
    (out / "interactive.md").write_text(md)
    data = {"meta": meta, "summary": summary, "load": load,
            "mismatches": mismatches(rows), "requests": rows}
    (out / "interactive.json").write_text(json.dumps(data, indent=1))
    files = [out / "interactive.json", out / "interactive.md"]
    files.append(plot(summary, load, out / "interactive.png"))
    return md, files


def problems(rows: list[dict], load_rows: list) -> list[str]:
    out = [f"greedy output differs from target-only: {m}" for m in mismatches(rows)]
    out += [f"{r['kind']}/{r['prompt']} {r['variant']} failed: {r['error']}"
            for r in rows if r["error"]]
    from specdec_tools.bench.load_report import failures

    return out + failures(load_rows)
