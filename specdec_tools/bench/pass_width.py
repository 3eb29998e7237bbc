"""`specdec bench-pass-width`: what a forward pass costs by its width, and what changing
the width between passes costs.

A Verify feeds the target 1 + n tokens (n drafts); a target-only step feeds 1. The
look-up (coordinator.drafters.trie) sends a different n nearly every round, so the target's
passes change width from one round to the next. OpenVINO's CPU plugin re-prepares every
node of a dynamic-shape graph when an input shape changes (shape inference and
executor set-up, outside the nodes' own run time), so a pass whose width differs from
the previous pass costs more than the same pass in a run of equal widths.

This measures both on the backend the target service runs (the paged OpenVINO graph,
one thread, pinned), with no RPC and no scheduler in the way:

  constant     runs of passes of one width (each followed by a crop back, as a Verify
               whose drafts were all rejected: the session grows by one per pass);
  alternating  passes of width 1 and the width in turn (a look-up round after a
               target-only round, and back).

The per-draft cost it reports is (constant(w) / constant(1) - 1) / (w - 1), the quantity
coordinator.drafters.costs's `verify_cost` stands for.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

WARM = 2  # passes of each run not counted (the first after a width change, and one more)


def _time_pass(backend, caches: list, rows: list[list[int]]) -> float:
    """One pass feeding rows[i] to caches[i] (every session the same width), then each
    cache cropped back to one token more than it held."""
    t0 = time.perf_counter()
    backend.forward_batch([(c, tokens, len(tokens)) for c, tokens in zip(caches, rows,
                                                                         strict=True)])
    seconds = time.perf_counter() - t0
    for c, tokens in zip(caches, rows, strict=True):
        backend.crop(c, backend.cache_len(c) - len(tokens) + 1)
    return seconds


def measure(backend, vocab: int, widths: list[int], passes: int, repeats: int,
            prompt_tokens: int, seed: int = 0, progress: bool = True,
            sessions: int = 1) -> list[dict]:
    """One row per width: median ms of a pass in a run of equal widths, and of each kind
    of pass when widths 1 and w alternate. `sessions`: each pass feeds that many
    sessions the width each (a lockstep step of that many generations)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(prompt_tokens)] for _ in range(sessions)]
    const: dict[int, list[float]] = {w: [] for w in widths}
    alt: dict[int, tuple[list[float], list[float]]] = {w: ([], []) for w in widths}
    bar = tqdm(total=repeats * len(widths), desc="bench-pass-width", unit="width",
               disable=not progress)
    for _ in range(repeats):
        for w in widths:
            for pattern in ([w], [1, w]) if w > 1 else ([w],):
                caches = [backend.new_cache() for _ in prompts]
                backend.forward_batch([(c, p, 1) for c, p in zip(caches, prompts,
                                                                 strict=True)])
                for i in range(passes + WARM):
                    width = pattern[i % len(pattern)]
                    s = _time_pass(backend, caches, [[rng.randrange(vocab)
                                                      for _ in range(width)]
                                                     for _ in caches])
                    if i < WARM:
                        continue
                    if len(pattern) == 1:
                        const[w].append(s)
                    else:
                        alt[w][0 if width == 1 else 1].append(s)
            bar.update()
    bar.close()
    base = statistics.median(const[1]) if const.get(1) else None
    rows = []
    for w in widths:
        c = statistics.median(const[w]) * 1000
        row = {"width": w, "constant_ms": c}
        if w > 1:
            row["alternating_ms"] = statistics.median(alt[w][1]) * 1000
            row["alternating_width1_ms"] = statistics.median(alt[w][0]) * 1000
            row["change_ms"] = row["alternating_ms"] - c
            if base:
                row["per_draft"] = (c / (base * 1000) - 1) / (w - 1)
        rows.append(row)
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    out = [f"- **Command:** `{meta['command']}` ({meta['date']})",
           f"- **Backend:** {meta['backend']}", "",
           "| width (1 + drafts) | constant run, ms | alternating with width 1, ms | "
           "its width-1 passes, ms | a width change costs, ms | per draft, of a 1-token pass |",
           "|---|---|---|---|---|---|"]

    def f(x, spec=".1f"):
        return "-" if x is None else f"{x:{spec}}"

    for r in rows:
        out.append(f"| {r['width']} | {f(r['constant_ms'])} | {f(r.get('alternating_ms'))} | "
                   f"{f(r.get('alternating_width1_ms'))} | {f(r.get('change_ms'))} | "
                   f"{f(r.get('per_draft'), '.3f')} |")
    return "\n".join(out) + "\n"


def _replay_names(text: str) -> list[str]:
    from specdec_tools.bench import prompts as bench_prompts

    names = [x.strip() for x in text.split(",") if x.strip()]
    shipped = [n for n, _ in bench_prompts.PROMPTS]
    unknown = [n for n in names if n not in shipped]
    if unknown:
        raise SystemExit(f"error: unknown prompt(s) {', '.join(unknown)} for --replay; "
                         f"shipped: {', '.join(shipped)}")
    return names


def _replays(args, names: list[str], backend, rows: list[dict]) -> list[dict]:
    """The look-up alone replayed over the target's greedy texts of the shipped prompts
    `names` (lookup_replay)."""
    from dataclasses import asdict

    from specdec.runtime.models import load_tokenizer
    from specdec_tools.bench import prompts as bench_prompts
    from specdec_tools.bench.lookup_replay import greedy_texts, replay

    shipped = dict(bench_prompts.PROMPTS)
    table = {r["width"]: r["constant_ms"] for r in rows}
    change = statistics.median([r["change_ms"] for r in rows if "change_ms" in r])

    def pass_ms(width: int) -> float:
        return table[width]  # --replay times every width a look-up round can have

    texts = greedy_texts(backend, load_tokenizer(args.model), {n: shipped[n] for n in names},
                         args.replay_tokens)
    return [{"prompt": n, "change_ms": change, **asdict(replay(*texts[n], pass_ms, change))}
            for n in names]


def replay_markdown(replays: list[dict]) -> str:
    if not replays:
        return ""
    out = ["", "The look-up alone replayed over the target's greedy text with these pass "
           f"costs (a width change: {replays[0]['change_ms']:.1f} ms, the median above; "
           "target passes only, no RPC):", "",
           "| prompt | tokens | rounds | drafts / accepted | width changes | replayed "
           "speedup | had changes cost nothing |", "|---|---|---|---|---|---|---|"]
    for r in replays:
        out.append(f"| {r['prompt']} | {r['tokens']} | {r['rounds']} | {r['drafted']} / "
                   f"{r['accepted']} | {r['width_changes']} | {r['speedup']:.2f}x | "
                   f"{r['speedup_free_changes']:.2f}x |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["width"] for r in rows], [r["constant_ms"] for r in rows], "o-",
             label="constant width")
    alt = [r for r in rows if "alternating_ms" in r]
    ax.plot([r["width"] for r in alt], [r["alternating_ms"] for r in alt], "s--",
            label="alternating with width 1")
    ax.set_xlabel("tokens in the pass (1 + drafts)")
    ax.set_ylabel("ms per pass (median)")
    ax.set_title("target pass cost by width")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> int:
    from coordinator.drafters.costs import LookupSettings
    from specdec.service_cli import load_backend
    from specdec.service_config import ModelServiceConfig

    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    widths = sorted({int(x) for x in args.widths.split(",") if x.strip()} | {1})
    if widths[0] < 1:
        print("error: widths must be >= 1", file=sys.stderr)
        return 2
    if args.passes < 2:
        print("error: --passes must be >= 2 (an alternating run times both widths)",
              file=sys.stderr)
        return 2
    replay_names = _replay_names(args.replay)  # an unknown one fails before the model loads
    if replay_names:  # every width a look-up round can have (up to 8 drafts)
        widths = sorted(set(widths) | set(range(1, LookupSettings().max_tokens + 2)))
    if args.sessions < 1:
        print("error: --sessions must be >= 1", file=sys.stderr)
        return 2
    cfg = ModelServiceConfig(model=args.model, backend="openvino", weights=args.weights,
                             inference_precision=args.precision, threads=args.threads,
                             dynamic_quantization=args.dynamic_quantization)
    print(f"== loading {args.model} ({args.weights}, {args.precision}, activation "
          f"quantization {args.dynamic_quantization}, paged OpenVINO, {args.threads} "
          f"thread(s))", file=sys.stderr, flush=True)
    backend = load_backend(cfg)
    rows = measure(backend, backend.vocab_size, widths, args.passes, args.repeats,
                   args.prompt_tokens, sessions=args.sessions)
    replays = _replays(args, replay_names, backend, rows) if replay_names else []
    meta = {"command": " ".join(["specdec"] + sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
            "backend": f"{args.model}, {args.weights} weights, {args.precision}, "
                       f"activation quantization {args.dynamic_quantization}, paged "
                       f"OpenVINO, {args.threads} thread(s), CPU "
                       f"{sorted(os.sched_getaffinity(0))}, {args.sessions} session(s) "
                       f"a pass"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, meta) + replay_markdown(replays)
    (out / "pass_width.md").write_text(md)
    (out / "pass_width.json").write_text(json.dumps(
        {"meta": meta, "rows": rows, "replay": replays}, indent=1))
    png = plot(rows, out / "pass_width.png")
    print(md)
    print(f"wrote {out / 'pass_width.json'}, {out / 'pass_width.md'}, {png}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    from specdec.service_config import dynamic_quantization

    p = sub.add_parser(
        "bench-pass-width", help="a target pass's cost by width, and a width change's",
        description="Times the target's forward pass (the paged OpenVINO graph the target "
                    "service runs, no RPC) by its width, 1 + drafts: in runs of one width, "
                    "and alternating with width 1 as look-up rounds do. The difference is "
                    "what a change of width costs the CPU plugin. Writes pass_width.json, "
                    "pass_width.md and pass_width.png.")
    p.add_argument("--model", default="smollm2-135m", help="model (default: %(default)s)")
    p.add_argument("--weights", default="fp32", help="IR weights (default: %(default)s)")
    p.add_argument("--precision", default="f32",
                   help="inference precision, as the target's --inference-precision "
                        "(default: %(default)s)")
    p.add_argument("--dynamic-quantization", default="auto", type=dynamic_quantization,
                   metavar="auto|off|GROUP",
                   help="int8/int4 weights: the activation quantization, as the services' "
                        "flag (auto = the CPU plugin's groups of 32; GROUP = groups of this "
                        "many; off) (default: %(default)s)")
    p.add_argument("--sessions", type=int, default=1,
                   help="sessions fed in each pass, the width each (a lockstep step of "
                        "this many generations; --replay uses the same table) (default: "
                        "%(default)s)")
    p.add_argument("--threads", type=int, default=1,
                   help="inference threads (default: %(default)s, as the benches' target)")
    p.add_argument("--cpu", type=int, default=None,
                   help="pin this process to this CPU (default: not pinned)")
    p.add_argument("--widths", default="1,2,3,4,5,6,7,8,9",
                   help="pass widths to time, comma-separated; 1 is always added "
                        "(default: %(default)s)")
    p.add_argument("--passes", type=int, default=10,
                   help=f"timed passes per run, at least 2, after {WARM} warm ones "
                        "(default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per width and pattern; medians over all (default: %(default)s)")
    p.add_argument("--prompt-tokens", type=int, default=48,
                   help="random prompt fed before each run (default: %(default)s)")
    p.add_argument("--replay", default="",
                   help="comma-separated shipped prompts (e.g. extraction,summarisation,"
                        "code): also generate the target's greedy text of each and replay "
                        "the look-up alone over it with the measured costs, with and "
                        "without the width-change cost (default: none)")
    p.add_argument("--replay-tokens", type=int, default=96,
                   help="greedy tokens per replayed prompt (default: %(default)s)")
    p.add_argument("--out", default="bench-results",
                   help="folder for the results (default: %(default)s)")
    p.set_defaults(func=run)
