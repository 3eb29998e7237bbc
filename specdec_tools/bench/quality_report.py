"""`specdec eval`'s files: eval.json (meta, rows, comparisons, every text), eval.md (the
tables) and eval.png (one bar chart per measure, a bar per mode)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from specdec_tools.bench import harness
from specdec_tools.bench.quality_score import Comparison, ModeRow

# issue 14: the speculative contrastive form's tok/s over the plain form's, at least
TARGET_RATIO = 1.3
EXCERPT_CHARS = 160

# (ModeRow field, column / plot title, format)
MEASURES = [
    ("tokens_per_s", "tok/s", ".1f"),
    ("distinct_1", "distinct-1", ".3f"),
    ("distinct_2", "distinct-2", ".3f"),
    ("entropy_1", "entropy-1 (bits)", ".2f"),
    ("entropy_2", "entropy-2 (bits)", ".2f"),
    ("entropy_3", "entropy-3 (bits)", ".2f"),
    ("seq_rep_4", "seq-rep-4", ".3f"),
    ("loglik", "target log-lik / token", ".3f"),
]


def _fmt(x, spec: str) -> str:
    return "-" if x is None else f"{x:{spec}}"


def _yes(x: bool | None) -> str:
    return "-" if x is None else ("yes" if x else "NO")


def _same(c: Comparison) -> str:
    if c.identical is None or c.required:
        return _yes(c.identical)
    return "yes" if c.identical else "no (another distribution)"


def rows_table(rows: list[ModeRow]) -> list[str]:
    head = ["mode", "gens", "texts", "tokens/gen"] + [t for _, t, _ in MEASURES] + \
        ["mean abs V_head", "acceptance", "wire bytes/token", "same ids every seed"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tps = (f"{_fmt(r.tokens_per_s, '.1f')} ({_fmt(r.tokens_per_s_min, '.1f')}-"
               f"{_fmt(r.tokens_per_s_max, '.1f')})")
        cells = [r.name, str(r.generations), str(r.texts_scored), _fmt(r.mean_tokens, ".1f"),
                 tps] + [_fmt(getattr(r, f), spec) for f, _, spec in MEASURES[1:]] + \
            [_fmt(r.mean_head_size, ".2f"), _fmt(r.acceptance, ".2f"),
             _fmt(r.bytes_per_token, ".0f"), _yes(r.deterministic)]
        out.append("| " + " | ".join(cells) + " |")
    return out


def comparisons_table(comparisons: list[Comparison], names: dict[str, str]) -> list[str]:
    out = ["| form | baseline | tok/s ratio | pairs | greedy ids identical |",
           "|---|---|---|---|---|"]
    for c in comparisons:
        out.append(f"| {names[c.scenario]} | {names[c.baseline]} | "
                   f"{_fmt(c.ratio, '.2f')}{'x' if c.ratio is not None else ''} | "
                   f"{c.pairs} | {_same(c)} |")
    return out


def verdict(comparisons: list[Comparison]) -> str | None:
    """Issue 14's speed criterion, on the greedy contrastive pair, in words."""
    c = next((c for c in comparisons if (c.scenario, c.baseline) ==
              ("cd-greedy-spec", "cd-greedy")), None)
    if c is None or c.ratio is None:
        return None
    met = "met" if c.ratio >= TARGET_RATIO else "NOT met"
    same = {True: "identical ids", False: "DIFFERENT ids", None: "ids not compared"}
    return (f"Speculative contrastive greedy runs at {c.ratio:.2f}x the plain form's tok/s "
            f"(target >= {TARGET_RATIO}x: {met}), {same[c.identical]} on {c.pairs} "
            "(prompt, seed) pairs.")


def excerpts(samples: list, rows: list[ModeRow]) -> list[str]:
    """The first prompt's first text of every mode, cut short, to read beside the figures."""
    if not samples:
        return []
    prompt = samples[0].prompt
    out = [f"First text of each mode for {prompt!r} (first {EXCERPT_CHARS} characters):", ""]
    for r in rows:
        s = next((s for s in samples if s.mode == r.mode and s.prompt == prompt), None)
        if s is not None:
            text = " ".join(s.text.split())[:EXCERPT_CHARS].replace("|", "\\|")
            out.append(f"- {r.name}: {text}")
    return out


def markdown(rows: list[ModeRow], comparisons: list[Comparison], meta: dict,
             samples: list | None = None) -> str:
    names = {r.mode: r.name for r in rows}
    out = [f"Machine: {meta.get('machine', '?')}. Target (expert): {meta.get('target', '?')}; "
           f"draft (amateur): {meta.get('draft', '?')}. {meta.get('prompts')} open-ended "
           f"prompts x {meta.get('seeds')} seeds x {meta.get('max_new_tokens')} new tokens, "
           f"modes interleaved per prompt, rounds "
           f"{'pipelined' if meta.get('pipeline', True) else 'sequential'}. Contrastive: "
           f"{meta.get('contrastive', '?')}. "
           f"Revision: {meta.get('revision', '?')}.", "",
           "Quality figures pool whitespace tokens over a mode's texts (greedy modes: one "
           "text per prompt); seq-rep-4 and the target's log-likelihood (mean log p per "
           "generated token, temperature 1) are means over texts; tok/s is the median over "
           "generations (min-max).", ""]
    out += rows_table(rows) + [""]
    if comparisons:
        out += [f"Speed: {meta.get('speedup_definition', harness.SPEEDUP_DEFINITION)}; here, "
                "each form's tok/s over its baseline's, per (prompt, seed).", ""]
        out += comparisons_table(comparisons, names) + [""]
    if (v := verdict(comparisons)) is not None:
        out += [v, ""]
    if samples:
        out += excerpts(samples, rows) + [""]
    return "\n".join(out)


def sample_dicts(samples: list, loglik=None) -> list[dict]:
    keep = ("mode", "scenario", "prompt", "repeat", "temperature", "tokens", "seconds",
            "wire_bytes", "text", "token_ids", "mean_head_size", "drafted", "accepted")
    out = []
    for s in samples:
        d = {k: getattr(s, k) for k in keep}
        d["tokens_per_s"] = s.tokens_per_s
        if loglik is not None:
            d["loglik"] = loglik(s.prompt, s.token_ids)
        out.append(d)
    return out


def write_json(path: Path, rows: list[ModeRow], comparisons: list[Comparison], meta: dict,
               samples: list[dict]) -> None:
    path.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows],
                                "comparisons": [asdict(c) for c in comparisons],
                                "samples": samples}, indent=2))


def plot(rows: list[ModeRow], path: Path) -> Path:
    """One bar chart per measure, a bar per mode (contrastive modes hatched)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    nrows = -(-len(MEASURES) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows + 1.2))
    labels = [r.name for r in rows]
    colours = [f"C{i}" for i in range(len(rows))]
    for ax, (f, title, _) in zip(axes.flat, MEASURES, strict=False):
        values = [getattr(r, f) if getattr(r, f) is not None else 0.0 for r in rows]
        bars = ax.bar(range(len(rows)), values, color=colours)
        for bar, r in zip(bars, rows, strict=True):
            if r.decoding == "contrastive":
                bar.set_hatch("//")
        ax.set_title(title)
        ax.set_xticks([])
    for ax in list(axes.flat)[len(MEASURES):]:
        ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, hatch="//" if r.decoding ==
                             "contrastive" else "") for c, r in zip(colours, rows, strict=True)]
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(rows)), fontsize=8)
    fig.suptitle("specdec eval: text quality and speed per decoding mode")
    fig.tight_layout(rect=(0, 0.12, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
