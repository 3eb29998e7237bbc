"""The docs' benchmark figures, generated from one results file (`specdec bench --report
docs/bench-latest.json`).

README.md and docs/benchmarks.md hold regions between `<!-- bench:NAME -->` and
`<!-- /bench:NAME -->`; `write()` replaces each with what `regions()` renders for NAME
from the JSON, so the two files cannot disagree with the results or with each other (a
unit test checks the committed files are exactly what this renders).
"""

from __future__ import annotations

import re
from pathlib import Path

from specdec_tools.bench import harness, report, rtt
from specdec_tools.bench.system import BASELINE

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", ROOT / "docs" / "benchmarks.md"]
REGION = re.compile(r"(<!-- bench:(?P<name>[\w.-]+) -->\n)(.*?)(<!-- /bench:(?P=name) -->)",
                    re.S)
PIPELINED = "specdec K=4 pipelined"
SEQUENTIAL = "specdec K=4"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _row(rows, name: str, temperature: float = 0.0):
    return next((r for r in rows if r.scenario == name and r.temperature == temperature), None)


def _is_peer(r) -> bool:
    return not r.scenario.startswith(("specdec", BASELINE))


def meta_lines(meta: dict) -> str:
    setups = meta.get("peer_setups") or {}
    out = [f"- **Command:** `{meta.get('command')}` ({meta.get('date')})",
           f"- **Machine:** {meta.get('machine')}",
           f"- **Model:** {meta.get('model')}; {meta.get('prompts')} prompts x "
           f"{meta.get('max_new_tokens')} new tokens, {meta.get('repeats')} repeats, "
           f"services {'pinned' if meta.get('pinned') else 'not pinned'}, "
           f"{meta.get('threads_per_service')} thread(s) each",
           f"- **Speedup:** {meta.get('speedup_definition', harness.SPEEDUP_DEFINITION)}"]
    if setups:
        out.append("- **Peer set-ups:** " + "; ".join(setups.values()))
    return "\n".join(out) + "\n"


def temperature_table(rows, temperature: float) -> str:
    return "\n".join(report.table([r for r in rows if r.temperature == temperature])) + "\n"


def headline(rows, meta: dict) -> str:
    """The figures the prose quotes, one bullet each."""
    base, seq, pipe = _row(rows, BASELINE), _row(rows, SEQUENTIAL), _row(rows, PIPELINED)
    out = []
    if pipe and base:
        out.append(f"- Greedy, K=4: pipelined specdec {pipe.tokens_per_s:.1f} tok/s, "
                   f"**{_x(pipe.speedup)}** over target-only ({base.tokens_per_s:.1f} tok/s); "
                   f"sequential rounds {seq.tokens_per_s:.1f} tok/s, {_x(seq.speedup)}."
                   if seq else "")
        out.append(f"- Time to first token: {pipe.ttft_ms:.0f} ms pipelined, "
                   f"{base.ttft_ms:.0f} ms target-only.")
    sweep = [r for r in rows if r.temperature == 0 and r.k and r.alpha is not None
             and r.scenario == f"specdec K={r.k}"]
    if sweep:
        best = max(sweep, key=lambda r: r.speedup or 0)
        out.append(f"- Sequential K sweep: best K={best.k}, {_x(best.speedup)}, at "
                   f"{best.efficiency:.2f} of the Leviathan bound.")
    for t in sorted({r.temperature for r in rows} - {0.0}):
        p = _row(rows, PIPELINED, t)
        if p:
            out.append(f"- Sampled at {t:g}: pipelined K=4 {p.tokens_per_s:.1f} tok/s, "
                       f"{_x(p.speedup)}.")
    peers = [r for r in rows if r.temperature == 0 and _is_peer(r)]
    if peers:
        top = max(peers, key=lambda r: r.tokens_per_s)
        out.append(f"- Fastest in-process peer (greedy): {top.scenario}, "
                   f"{top.tokens_per_s:.1f} tok/s, {_x(top.speedup)}.")
    return "\n".join(x for x in out if x) + "\n"


def loops_table(rows) -> str:
    """specdec's K=4 loop variants, greedy and sampled side by side."""
    temps = sorted({r.temperature for r in rows})
    head = "| loop (K=4) | " + " | ".join(f"tok/s @ {t:g} | speedup @ {t:g}" for t in temps)
    out = [head + " | TTFT ms (greedy) |", "|---|" + "---|---|" * len(temps) + "---|"]
    names = [BASELINE] + [r.scenario for r in rows if r.temperature == 0
                          and r.scenario.startswith(SEQUENTIAL)]
    for name in names:
        cells = []
        for t in temps:
            r = _row(rows, name, t)
            cells += ["-", "-"] if r is None else [f"{r.tokens_per_s:.1f}", _x(r.speedup)]
        g = _row(rows, name)
        out.append(f"| {name} | " + " | ".join(cells) +
                   f" | {'-' if g is None or g.ttft_ms is None else f'{g.ttft_ms:.0f}'} |")
    return "\n".join(out) + "\n"


def peers_table(rows) -> str:
    out = ["| scenario (greedy) | tok/s (min-max) | speedup | TTFT ms |", "|---|---|---|---|"]
    for r in rows:
        if r.temperature == 0 and (_is_peer(r) or r.scenario in (BASELINE, PIPELINED)):
            ttft = "-" if r.ttft_ms is None else f"{r.ttft_ms:.0f}"
            out.append(f"| {r.scenario} | {r.tokens_per_s:.1f} ({r.tokens_per_s_min:.1f}-"
                       f"{r.tokens_per_s_max:.1f}) | {_x(r.speedup)} | {ttft} |")
    return "\n".join(out) + "\n"


def regions(rows, meta: dict) -> dict[str, str]:
    """Region name -> its generated Markdown."""
    out = {"meta": meta_lines(meta), "headline": headline(rows, meta),
           "loops": loops_table(rows), "peers": peers_table(rows),
           "notes": "\n".join(report.notes(meta)) + "\n"}
    for t in sorted({r.temperature for r in rows}):
        out[f"temperature-{t:g}"] = temperature_table(rows, t)
    if meta.get("rtt_sweep"):
        sweep = [rtt.RttRow(**d) for d in meta["rtt_sweep"]]
        k = 4 if _row(rows, PIPELINED) else 0
        out["rtt"] = rtt.markdown(sweep, k).split("\n", 2)[2]  # without its heading
    return out


def render(text: str, generated: dict[str, str]) -> str:
    """`text` with every bench region replaced; an unknown region name is an error."""
    def replace(m: re.Match) -> str:
        name = m.group("name")
        if name not in generated:
            raise KeyError(f"no generated region named {name!r} (known: "
                           f"{', '.join(sorted(generated))})")
        return m.group(1) + generated[name] + m.group(4)

    return REGION.sub(replace, text)


def write(json_path: Path, files: list[Path] | None = None) -> list[Path]:
    rows, meta = report.load_json(json_path)
    generated = regions(rows, meta)
    changed = []
    for path in files or FILES:
        text = path.read_text()
        new = render(text, generated)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed
