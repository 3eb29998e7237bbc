"""`specdec eval`: text quality and speed of every decoding mode on the open-ended
prompts (issue 14), through the real services, written as JSON, Markdown and a bar plot.

Starts the pair as processes (the target is the expert, the draft the amateur; placed by
specdec.pair.placement()), runs specdec_tools.bench.quality_eval's modes side by side through
the coordinator's GenerationService in this process (pipelined rounds unless
--no-pipeline, no Ray), stops
the services, then scores every text with the target model in this process (torch,
fp32) and writes `eval.json`, `eval.md` and `eval.png` under --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from specdec_tools.bench import harness, open_prompts, quality_eval, quality_report, quality_score
from specdec_tools.bench.quality_eval import FORMULATIONS, MODE_KEYS, ContrastiveSettings


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pair(args: argparse.Namespace):
    from specdec import pair as pairs
    from specdec.runtime.models import TINY_NAMES

    if args.model in TINY_NAMES:  # tests and smoke runs: the tiny torch pair
        return pairs.TINY_PAIR, "tiny-random (torch)", "tiny-random-draft (torch)"
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export

    hf = prepare_smollm2()
    export(hf, "fp32", say=_say)
    export(hf, args.draft_weights, say=_say)
    pair = pairs.CONTRASTIVE_PAIR.with_models(args.model, args.model)
    pair = pairs.Pair(pair.name, pair.target, pair.draft.with_(weights=args.draft_weights))
    return (pair, f"{args.model} (OpenVINO fp32)",
            f"{args.model} (OpenVINO {args.draft_weights}, the expert's own quantized copy)")


def _revision() -> str:
    """HEAD's commit, and "+ uncommitted changes" when the tree differs from it (the
    services run from the tree)."""
    import subprocess

    from specdec.launcher import ROOT

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout

    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "-uno").strip()
                   else "")


def settings_of(args: argparse.Namespace) -> ContrastiveSettings:
    return ContrastiveSettings(args.alpha, args.beta, args.amateur_temperature,
                               args.formulation)


def run(args: argparse.Namespace) -> int:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import pair as pairs
    from specdec.runtime import models
    from specdec_tools.bench.harness import machine

    chosen = quality_eval.modes(args.k, args.temperature, _keys(args.modes))
    prompts = open_prompts.PROMPTS[:args.prompts]
    seeds = open_prompts.SEEDS[:args.seeds]
    settings = settings_of(args)
    revision = _revision()  # what the services start from
    out_dir = Path(args.out or f"bench-results/eval-{args.draft_weights}")
    out_dir.mkdir(parents=True, exist_ok=True)
    _say("== preparing the models (cached)")
    pair, target_label, draft_label = _pair(args)
    t0 = time.perf_counter()
    with ExitStack() as stack:
        _say("== starting target (expert) and draft (amateur) services")
        running = pairs.start(pair, stack, pin=args.pin)
        service = build_service(CoordinatorConfig(target=running.target.address,
                                                  draft=running.draft.address,
                                                  pipeline=args.pipeline))
        ids = {p: quality_eval.prompt_ids(service, p) for p in prompts}
        _say(f"== {len(chosen)} modes x {len(prompts)} prompts x {len(seeds)} seeds x "
             f"{args.max_new_tokens} tokens")
        samples = quality_eval.run_modes(service, chosen, prompts, seeds, args.max_new_tokens,
                                         settings, say=_say)
        target_args = pair.target.args(0, running.cpus["target"])
        draft_args = pair.draft.args(0, running.cpus["draft"])
        pinned = running.pinned
    run_s = time.perf_counter() - t0
    _say("== scoring: the target's log-likelihood of every text (torch, fp32, in process)")
    scorer = models.load(args.model).model
    loglik = quality_score.cached(
        lambda p, tokens: quality_score.mean_loglik(scorer, ids[p], tokens))
    for s in tqdm(samples, desc="log-likelihood", unit="text"):
        loglik(s.prompt, s.token_ids)
    rows, comparisons = quality_score.summarise(samples, chosen, loglik)
    meta = {"machine": machine(), "target": target_label, "draft": draft_label,
            "draft_weights": args.draft_weights, "prompts": len(prompts),
            "prompt_texts": prompts, "seeds": len(seeds), "seed_values": seeds,
            "max_new_tokens": args.max_new_tokens, "k": args.k, "pipeline": args.pipeline,
            "temperature": args.temperature,
            "contrastive": _describe(settings), "pinned": pinned,
            "target_args": target_args, "draft_args": draft_args,
            "speedup_definition": harness.SPEEDUP_DEFINITION, "run_seconds": round(run_s, 1),
            "revision": revision, "command": " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%d")}
    md = quality_report.markdown(rows, comparisons, meta, samples)
    (out_dir / "eval.md").write_text(md)
    quality_report.write_json(out_dir / "eval.json", rows, comparisons, meta,
                              quality_report.sample_dicts(samples, loglik))
    png = quality_report.plot(rows, out_dir / "eval.png") if rows else None
    print(md)
    _say(f"wrote {out_dir / 'eval.json'}, {out_dir / 'eval.md'}"
         + (f", {png}" if png else "") + f" (runs took {run_s:.0f} s)")
    bad = [c for c in comparisons if c.required and c.identical is False]
    for c in bad:
        _say(f"FAILURE: {c.scenario} and {c.baseline} produced different greedy ids: "
             + "; ".join(c.mismatches[:5]))
    return 1 if bad else 0


def _keys(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _describe(s: ContrastiveSettings) -> str:
    def value(x, default: str) -> str:
        return default + " (server default)" if x is None else f"{x:g}"

    return (f"formulation {s.formulation}, alpha {value(s.alpha, '0.1')}, beta "
            f"{value(s.beta, '0.5')}, amateur temperature "
            f"{value(s.amateur_temperature, '1')}")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval", help="text quality and tok/s of target-only, speculative and contrastive "
                     "decoding on open-ended prompts",
        description=__doc__.split("\n\n")[0] + " Modes: " + ", ".join(
            f"{m.key} = {m.name}" for m in quality_eval.modes()) + ". Measures: distinct-1/2, "
        "n-gram entropy 1/2/3 and seq-rep-4 over whitespace tokens, the target's mean "
        "log-likelihood per generated token, mean |V_head| (contrastive), tok/s; and the "
        "tok/s ratio of each speculative form over its plain form (the project's speedup "
        "definition, the plain form as the baseline: " +
        harness.SPEEDUP_DEFINITION + "), with greedy ids compared (exit 1 if they differ). "
        "Needs `specdec prepare --openvino --weights fp32,<draft weights>` (done here "
        "when missing).")
    p.add_argument("--prompts", type=int, default=len(open_prompts.PROMPTS),
                   help="how many of the shipped open-ended prompts, from the first "
                        "(specdec_tools/bench/open_prompts.py) (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=3,
                   help="sampling seeds per prompt, at most "
                        f"{len(open_prompts.SEEDS)}; greedy modes repeat over them for "
                        "timing (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=96,
                   help="tokens per generation (fewer when the model ends its text) "
                        "(default: %(default)s)")
    p.add_argument("--k", type=int, default=4,
                   help="draft tokens per round of the speculative forms (default: "
                        "%(default)s)")
    p.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=True,
                   help="pipelined rounds, the coordinator's default: the draft drafts the "
                        "next round while the target verifies this one (speculative and "
                        "contrastive forms alike); --no-pipeline runs sequential rounds "
                        "(default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="temperature of the sampled modes; for contrastive ones it divides "
                        "the contrastive score (default: %(default)s)")
    p.add_argument("--alpha", type=float,
                   help="plausibility cut: V_head = {x : p_exp(x) >= alpha * max p_exp} "
                        "(Li et al. 2022); default: the server's, 0.1")
    p.add_argument("--beta", type=float,
                   help="the amateur's weight in O'Brien & Lewis's (1 + beta) s_exp - beta "
                        "s_ama; default: the server's, 0.5")
    p.add_argument("--amateur-temperature", type=float,
                   help="the amateur's temperature in Li et al.'s log p_exp - log p_ama; "
                        "default: the server's, 1")
    p.add_argument("--formulation", choices=FORMULATIONS, default="obrien",
                   help="obrien = O'Brien & Lewis 2023 (logit space), li = Li et al. 2022 "
                        "(log-probabilities) (default: %(default)s)")
    p.add_argument("--draft-weights", choices=("int8", "int4", "fp32"), default="int8",
                   help="the amateur's OpenVINO weights; the same model quantized (int4 "
                        "is the more different amateur; fp32 equals the expert); ignored "
                        "for tiny models (default: %(default)s)")
    p.add_argument("--modes", default=",".join(MODE_KEYS),
                   help="comma-separated among " + ", ".join(MODE_KEYS) +
                        " (default: all)")
    p.add_argument("--model", default="smollm2-135m",
                   help="model of both services and of the scorer; tiny-random runs the "
                        "tiny torch pair (default: %(default)s)")
    p.add_argument("--no-pin", dest="pin", action="store_false", default=True,
                   help="let draft and target share all CPUs (default: separate CPUs when "
                        "there are two)")
    p.add_argument("--out", help="folder for eval.json, eval.md and eval.png (default: "
                                 "bench-results/eval-<draft weights>)")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run: {open_prompts.QUICK_PROMPTS} prompts, "
                        f"{open_prompts.QUICK_SEEDS} seed, 32 tokens")

    def main(args) -> int:
        if args.quick:
            args.prompts, args.seeds = open_prompts.QUICK_PROMPTS, open_prompts.QUICK_SEEDS
            args.max_new_tokens = 32
        if not 1 <= args.seeds <= len(open_prompts.SEEDS):
            p.error(f"--seeds must be in [1, {len(open_prompts.SEEDS)}]")
        if not 1 <= args.prompts <= len(open_prompts.PROMPTS):
            p.error(f"--prompts must be in [1, {len(open_prompts.PROMPTS)}]")
        if args.k < 1:
            p.error("--k must be at least 1 (the speculative forms' draft tokens)")
        try:
            quality_eval.modes(args.k, args.temperature, _keys(args.modes))
        except ValueError as e:
            p.error(str(e))
        return run(args)

    p.set_defaults(func=main)
