"""`specdec replay-predraft`: the pipelined-drafting schemes of
specdec_tools.bench.predraft_replay, replayed on a served pair's own models: the
target's greedy texts of the interactive prompts, the draft's ranks along them, and
the two models' pass costs measured here (specdec_tools.bench.pass_width)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from specdec_tools.bench.predraft_replay import (
    PassCosts,
    Scheme,
    agreement,
    draft_ranks,
    median_speedup,
)

DRAFT_SESSIONS = (1, 4, 8, 16)  # one-token draft passes timed over this many sessions


def _backends(args):
    """The pair's two backends, as its services would load them (their own flags)."""
    from draft_service.config import from_args as draft_config
    from specdec.pair import SERVED
    from specdec.service_cli import load_backend
    from target_service.config import from_args as target_config

    pair = SERVED[args.pair].with_models(args.target_model, args.draft_model)
    print(f"== loading {pair.target.model} and {pair.draft.model} as `specdec up --pair "
          f"{args.pair}` serves them", file=sys.stderr, flush=True)
    return (load_backend(target_config(pair.target.args())),
            load_backend(draft_config(pair.draft.args())), pair)


def _costs(target, draft, max_k: int, branches: int, passes: int) -> PassCosts:
    from specdec_tools.bench.pass_width import measure

    print("== timing the target's passes (widths 1..K+1) and the draft's one-token passes",
          file=sys.stderr, flush=True)
    verify = {r["width"]: r["constant_ms"]
              for r in measure(target, target.vocab_size, list(range(1, max_k + 2)), passes,
                               1, 64, progress=True)}
    widest = 1 + branches + max_k * branches
    sessions = sorted({s for s in DRAFT_SESSIONS if s < widest} | {1, widest})
    drafts = {}
    for s in sessions:
        (row,) = measure(draft, draft.vocab_size, [1], passes, 1, 64, progress=False,
                         sessions=s)
        drafts[s] = row["constant_ms"]
    return PassCosts(verify, drafts)


def _texts(target, draft, tokenizer, kinds: list[str], max_new_tokens: int) -> dict:
    from specdec_tools.bench.interactive_prompts import SETS
    from specdec_tools.bench.lookup_replay import greedy_texts

    out = {}
    for kind in kinds:
        messages = dict(SETS["held-out"][kind])
        texts = greedy_texts(target, tokenizer, messages, max_new_tokens)
        out[kind] = [(text, draft_ranks(draft, prompt, text)) for prompt, text in
                     texts.values() if text]
    return out


def markdown(result: dict) -> str:
    meta = result["meta"]
    out = [f"- **Command:** `{meta['command']}` ({meta['date']})",
           f"- **Pair:** {meta['pair']}; CPU {meta['cpus']}",
           f"- **Pass costs, ms:** target by width {meta['verify_ms']}; draft one-token "
           f"pass by sessions {meta['draft_ms']}", ""]
    for kind, block in result["kinds"].items():
        a = block["agreement"]
        out += [f"### {kind} (replayed speedup: median over {block['prompts']} prompts)", "",
                f"Draft's first choice = target's token: {a['top1']:.3f}; on a miss its "
                f"second is: {a['rank2_of_misses']:.2f}, its second or third: "
                f"{a['ranks23_of_misses']:.2f}.", "",
                "| scheme | " + " | ".join(f"K={k}" for k in block["ks"]) + " |",
                "|---|" + "---|" * len(block["ks"])]
        for row in block["rows"]:
            out.append(f"| {row['scheme']} | " + " | ".join(f"{x:.2f}x" for x in row["speedups"])
                       + " |")
        out.append("")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    from specdec.runtime.models import load_tokenizer

    ks = sorted({int(x) for x in args.ks.split(",") if x.strip()})
    branches = sorted({int(x) for x in args.branches.split(",") if x.strip()} | {0})
    kinds = [x.strip() for x in args.kinds.split(",") if x.strip()]
    from specdec_tools.bench.interactive_prompts import KINDS
    bad = [k for k in kinds if k not in KINDS]
    if not ks or ks[0] < 1 or bad or branches[0] < 0 or args.max_new_tokens < 2:
        print(f"error: --ks must be positive integers, --branches non-negative, --kinds "
              f"among {', '.join(KINDS)} (got {', '.join(bad) or 'none unknown'}), "
              f"--max-new-tokens at least 2", file=sys.stderr)
        return 2
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    target, draft, pair = _backends(args)
    costs = _costs(target, draft, ks[-1], branches[-1], args.passes)
    texts = _texts(target, draft, load_tokenizer(pair.target.model), kinds,
                   args.max_new_tokens)
    schemes = [(f"{b} branch(es)" if b else "today: one pre-draft, fetch K", b, None)
               for b in branches] + [(f"fetch {f} after a miss", 0, f)
                                     for f in (1, 2)]
    result = {"meta": {"command": " ".join(["specdec"] + sys.argv[1:]),
                       "date": time.strftime("%Y-%m-%d"), "pair": pair.name,
                       "cpus": sorted(os.sched_getaffinity(0)),
                       "verify_ms": {k: round(v, 1) for k, v in costs.verify_ms.items()},
                       "draft_ms": {k: round(v, 1) for k, v in costs.draft_ms.items()}},
              "kinds": {}}
    for kind, pairs in texts.items():
        rows = [{"scheme": label, "branches": b, "fetch": f,
                 "speedups": [median_speedup(pairs, costs, Scheme(k, b, f)) for k in ks]}
                for label, b, f in schemes]
        result["kinds"][kind] = {"prompts": len(pairs), "ks": ks, "rows": rows,
                                 "agreement": vars(agreement(pairs))}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "predraft_replay.json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    (out / "predraft_replay.md").write_text(md)
    print(md)
    print(f"wrote {out / 'predraft_replay.json'} and {out / 'predraft_replay.md'}",
          file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    from specdec.pair import SERVED

    p = sub.add_parser(
        "replay-predraft", help="what pipelined-drafting schemes could give, replayed offline",
        description="Replays greedy speculative decoding one request at a time, without the "
                    "services, on a served pair's models: the target's greedy text of each "
                    "held-out interactive prompt, the draft's ranks along it, and both "
                    "models' pass costs timed here. Compares today's pipelining (one "
                    "pre-draft, on every draft accepted) with pre-drafts on branches (also "
                    "on each rejection point, the target's token guessed among the draft's "
                    "next ranks) and with shorter fetches after a miss. RPCs and the "
                    "coordinator's own time are left out: the figures rank the schemes and "
                    "bound them. Writes predraft_replay.json and predraft_replay.md.")
    p.add_argument("--pair", default="qwen2.5-coder", choices=sorted(SERVED),
                   help="the served pair whose settings load the models (default: "
                        "%(default)s)")
    p.add_argument("--target-model", default=None,
                   help="another target model, at the pair's settings (default: the pair's)")
    p.add_argument("--draft-model", default=None,
                   help="another draft model, at the pair's settings (default: the pair's)")
    p.add_argument("--kinds", default="general,code",
                   help="held-out interactive prompt kinds, comma-separated (default: "
                        "%(default)s)")
    p.add_argument("--ks", default="1,2,3,4,5,6", help="K to replay (default: %(default)s)")
    p.add_argument("--branches", default="0,1,2",
                   help="branch widths B to replay; 0 (today's) is always in (default: "
                        "%(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="greedy tokens per prompt (default: %(default)s)")
    p.add_argument("--passes", type=int, default=6,
                   help="timed passes per measured pass cost (default: %(default)s)")
    p.add_argument("--cpu", type=int, default=None,
                   help="pin this process to this CPU (default: not pinned)")
    p.add_argument("--out", default="bench-results",
                   help="folder for the results (default: %(default)s)")
    p.set_defaults(func=run)
