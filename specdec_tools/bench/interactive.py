"""`specdec bench --interactive`: the server's drafting decision against every fixed K.

Through `specdec up`'s defaults (the stack started here, as `specdec up` starts it, or a
running one with --address), two parts:

1. **One request at a time.** For each kind of prompt (general chat, grounded answers,
   code: specdec_tools.bench.interactive_prompts; and "penalised", the general prompts
   with OpenAI's presence and frequency penalties) and each prompt, one greedy chat
   request per variant, back to back: target-only (K=0), the server's K
   (num_draft_tokens unset) and every fixed K in --ks. The variants' order rotates from
   prompt to prompt so that none always runs first. Before the variants, a discarded
   2-token request at K=1 puts the prompt into both services' prefix caches, so every
   variant meets the same warm caches: without it the first variant alone paid the
   prompt's prefill (on the Qwen pair 0.5 s of TTFT against 0.2 s), which made a ratio
   depend on the rotation. Speedup is section 12's (docs/design.md): per (prompt,
   repeat), a variant's tok/s over target-only's.
2. **Under load.** specdec load's sweep (specdec_tools.bench.load.run_levels) over the
   general prompts: target-only and the server's K through the same coordinator, beside
   OpenVINO GenAI's continuous batching on the target's core (--peers genai) and
   llama.cpp's server there on the pair's GGUF files (--peers llamacpp).

Greedy outputs are checked: every variant's text must equal target-only's, token for
token. Results: interactive.json, interactive.md and interactive.png in --out (the load
sweep's own files in --out/load).
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from specdec_tools.bench.interactive_prompts import KINDS, SETS
from specdec_tools.bench.load import GrpcVariant
from specdec_tools.bench.load_report import Load, LoadSample

SERVER = "server"
PENALISED = "penalised"  # the general prompts, with PENALTIES on every request
PENALTIES = dict(presence_penalty=0.5, frequency_penalty=0.5)
DEFAULT_KINDS = (*KINDS, PENALISED)


def kind_prompts(prompt_set: str, kinds: list[str]) -> dict[str, list[tuple[str, str]]]:
    """{kind: [(name, text)]} for the kinds asked, in that order."""
    bad = [k for k in kinds if k not in DEFAULT_KINDS]
    if bad:
        raise SystemExit(f"--kinds: unknown {', '.join(bad)}; choose among "
                         f"{', '.join(DEFAULT_KINDS)}")
    sets = SETS[prompt_set]
    return {k: sets["general" if k == PENALISED else k] for k in kinds}


def variant_name(k: int | None) -> str:
    return SERVER if k is None else f"K={k}"


def order(variants: list, i: int) -> list:
    """The variants rotated by i: prompt i starts with variant i mod len."""
    j = i % len(variants)
    return variants[j:] + variants[:j]


def one_at_a_time(address: str, prompts: dict[str, list[tuple[str, str]]], ks: list[int],
                  max_new_tokens: int, repeats: int, tls=None, say=print,
                  target_passes=None) -> list[dict]:
    """Every (kind, prompt, repeat) through every variant, one request at a time; a row
    per request. `target_passes()`: the target service's forward passes so far, as
    (seconds, count) (drain.histogram_totals on its metrics port); read around each
    request, it gives the row's mean target pass (None where it is not given): what a
    Verify of that variant's width costs in the service itself, RPCs and the
    coordinator left out."""
    variants = [0, None] + [k for k in ks if k > 0]
    clients = {k: GrpcVariant(address, k, variant_name(k), tls=tls) for k in variants}
    jobs = [(kind, name, text, r) for r in range(repeats) for kind in prompts
            for name, text in prompts[kind]]
    prefill = GrpcVariant(address, 1, "prefill", tls=tls)
    warm = Load(1, 8, (jobs[0][2],))
    for k in variants:  # a warm-up request per variant, discarded
        clients[k].window(warm, "warm-up")
    rows = []
    bar = tqdm(jobs, desc="one at a time", unit="prompt")
    for i, (kind, name, text, r) in enumerate(bar):
        bar.set_postfix_str(f"{kind}/{name}")
        load = Load(1, max_new_tokens, (text,), **(PENALTIES if kind == PENALISED else {}))
        prefill.window(Load(1, 2, (text,)), "prefill")  # both caches warm for every variant
        for k in order(variants, i):
            before = target_passes() if target_passes else None
            sample = clients[k].window(load).samples[0]
            rows.append(_row(sample, kind, name, r, k))
            if before is not None:
                seconds, passes = (a - b for a, b in zip(target_passes(), before,
                                                         strict=True))
                rows[-1]["target_passes"] = int(passes)
                rows[-1]["target_pass_ms"] = seconds / passes * 1e3 if passes else None
        base = next(x for x in rows[-len(variants):] if x["variant"] == "K=0")
        srv = next(x for x in rows[-len(variants):] if x["variant"] == SERVER)
        bar.write(f"  {kind}/{name}: target-only {base['tok_s']:.1f} tok/s, server "
                  f"{srv['tok_s'] / base['tok_s']:.2f}x (mean K {srv['mean_k']:.2f}"
                  f"{', ' + srv['reason'] if srv['reason'] else ''})", file=sys.stderr)
    return rows


def _row(s: LoadSample, kind: str, name: str, repeat: int, k: int | None) -> dict:
    ks = s.k_per_round
    return {"kind": kind, "prompt": name, "repeat": repeat, "variant": variant_name(k),
            "k": k, "tokens": s.tokens, "seconds": s.seconds,
            "tok_s": s.tokens / s.seconds if s.seconds else 0.0, "ttft": s.ttft,
            "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
            "drafts_per_round": sum(ks) / len(ks) if ks else 0.0,
            "mean_k": s.mean_k, "reason": s.k_reason, "error": s.error,
            "token_ids": list(s.token_ids)}


def run(args) -> int:
    from specdec import stack
    from specdec.pair import SERVED, placement
    from specdec_tools.bench import drain, load_peers, load_report
    from specdec_tools.bench import interactive_report as report
    from specdec_tools.bench import load as load_bench
    from specdec_tools.bench.harness import comma_list as _list
    from specdec_tools.bench.harness import machine

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    prompts = kind_prompts(args.prompt_set, _list(args.kinds) or list(DEFAULT_KINDS))
    ks = sorted({int(k) for k in _list(args.ks)})
    levels = sorted({int(n) for n in _list(args.concurrency)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": machine(), "command": " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%d"), "prompt_set": args.prompt_set,
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "ks": ks,
            "concurrency": levels, "speedup_definition": report.SPEEDUP}
    with ExitStack() as es:
        # `specdec up`'s defaults, on free ports
        # the target with a metrics port: its own pass times, read around each request
        pair, metrics = drain.with_metrics_ports(SERVED[args.pair])
        cfg = stack.StackConfig(pair=pair, port=drain.free_port(), draft_port=0,
                                target_port=0, http_port=0, pin=args.pin)
        tls, passes = None, None
        if args.address:
            address = args.address
            meta["coordinator"] = f"given: {address}"
        else:
            say("== starting target, draft and coordinator (as `specdec up`, defaults)")
            running = stack.start(cfg, es)
            address, tls = running.address, running.client_tls
            meta["coordinator"] = "specdec up defaults, started here"
            meta["target_args"] = cfg.pair.target.args(0, placement(cfg.pin)["target"])
            meta["draft_args"] = cfg.pair.draft.args(0, placement(cfg.pin)["draft"])

            def passes():
                return drain.histogram_totals(metrics["target"], drain.TARGET_PASSES)
        rows = one_at_a_time(address, prompts, ks, args.max_new_tokens, args.repeats, tls,
                             say, passes) if not args.skip_interactive else []
        windows = []
        if levels:
            general = tuple(t for _, t in SETS[args.prompt_set]["general"])

            def load_for(n: int) -> Load:
                return Load(n, args.max_new_tokens, general, duration_s=args.duration_s)

            families = tuple(f for f in load_peers.FAMILIES if f in _list(args.peers))
            peers = load_peers.start("target-device", placement(cfg.pin)["target"],
                                     _peer_options(cfg.pair, args.pair), say, families)
            try:
                windows = load_bench.run_levels(
                    load_bench.system_variants(["grpc"], address, None, tls) + peers,
                    levels, load_for, args.load_repeats, failed=meta.setdefault("failed", {}),
                    desc="load", say=say)
            finally:
                for peer in peers:
                    peer.close()
    load_rows = load_report.summarise(windows, True) if windows else []
    if load_rows:
        load_report.write(load_rows, {**meta, "prompts": len(general),
                                      "prompt_set": f"{args.prompt_set} general"},
                          out / "load")
    md, files = report.write(rows, load_rows, meta, out)
    print(md)
    say("wrote " + ", ".join(str(f) for f in files))
    problems = report.problems(rows, load_rows)
    for p in problems:
        say(f"FAILURE: {p}")
    return 1 if problems else 0


def _peer_options(pair, name: str) -> dict:
    """The peers' models: the IRs `pair` (specdec.pair.SERVED[name]) serves its models at
    (GenAI's) and, for a pair prepared from GGUF files, those files (llama.cpp's)."""
    from coordinator.loop.policy import DEFAULT_POLICY
    from specdec.runtime.models import resolve
    from specdec.runtime.openvino_export import resolve_ir
    from specdec_tools.bench.llamacpp_peer import gguf_options

    def ir(spec) -> str:
        return str(resolve_ir(spec.model, spec.weights)[0])

    return dict(hf=resolve(pair.target.model), target_ir=ir(pair.target),
                draft_ir=ir(pair.draft), k=DEFAULT_POLICY.k, precision="f32",
                **gguf_options(name))


def add_arguments(p) -> None:
    """`specdec bench`'s flags for --interactive."""
    g = p.add_argument_group("--interactive (the server's drafting decision)")
    g.add_argument("--prompt-set", default="held-out", choices=sorted(SETS),
                   help="held-out = the prompts nothing was tuned on; tune = those the "
                        "drafting decision was developed on (default: %(default)s)")
    g.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                   help="kinds of prompt, comma-separated; penalised = the general "
                        "prompts with presence_penalty and frequency_penalty 0.5 "
                        "(default: %(default)s)")
    g.add_argument("--ks", default="1,2,3,4,5,6,7,8",
                   help="the fixed K compared with the server's (default: %(default)s)")
    g.add_argument("--concurrency", default="1,2,4,8,16,32",
                   help="the load sweep's stream counts, comma-separated; empty = no load "
                        "sweep (default: %(default)s)")
    g.add_argument("--duration-s", type=float, default=15.0,
                   help="seconds each load window keeps its streams busy "
                        "(default: %(default)s)")
    g.add_argument("--load-repeats", type=int, default=1,
                   help="windows per (variant, N) in the load sweep, interleaved "
                        "(default: %(default)s)")
    g.add_argument("--skip-interactive", action="store_true",
                   help="only the load sweep")
    from specdec.pair import SERVED

    g.add_argument("--pair", default="smollm2", choices=sorted(SERVED),
                   help="the pair `specdec up --pair` serves (both forms of the bench): "
                        "the services started here, the GenAI peers' IRs and HF's folders. "
                        "smollm2 = --model drafting for itself (fp32 target, int8 draft); "
                        "qwen2.5-coder = Qwen2.5-Coder-0.5B drafting for -1.5B "
                        "(default: %(default)s)")
    g.add_argument("--address", metavar="HOST:PORT",
                   help="use a running coordinator (gRPC) instead of starting the stack")
