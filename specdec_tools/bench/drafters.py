"""`specdec bench-drafters`: who drafts, side by side (issue 16).

Target-only, the model-free look-up with no draft service, the draft model pipelined,
and the hybrid (look-up or draft model per round, pipelined), all through the real
services and the coordinator's GenerationService, interleaved per prompt; beside them
OpenVINO GenAI's speculative and prompt-lookup pipelines in the two peer set-ups of
specdec_tools.bench.peers. Reports, per scenario: the speedup (harness.SPEEDUP_DEFINITION)
over all prompts and over the copy-heavy ones, acceptance per drafter, the pre-drafts'
hit rate, bytes per round; and specdec's tok/s over each GenAI row's (the
median of per-prompt ratios). Greedy runs check every text against target-only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from specdec_tools.bench import harness
from specdec_tools.bench import prompts as bench_prompts
from specdec_tools.bench.harness import Sample
from specdec_tools.bench.system import BASELINE, SystemScenario

COPY_HEAVY = ("extraction", "summarisation")  # the issue's look-up prompts (plus code)
SCENARIOS = {  # name -> (label, CoordinatorConfig options)
    "lookup": (" model-free, no draft service", dict(draft="", drafter="lookup")),
    "model": (" draft model pipelined", dict(drafter="model", pipeline=True)),
    "hybrid": (" hybrid pipelined", dict(drafter="hybrid", pipeline=True)),
    "hybrid-uncoupled": (" hybrid pipelined, bonus guess not coupled",
                         dict(drafter="hybrid", pipeline=True, couple_bonus=False)),
}
DEFAULT_SCENARIOS = "lookup,model,hybrid"
PEER_KINDS = ("genai-speculative", "genai-lookup")


class StatsScenario(SystemScenario):
    """A SystemScenario whose samples carry their GenerationStats (`sample.stats`)."""

    def run(self, message, max_new_tokens, sampling):
        sample = super().run(message, max_new_tokens, sampling)
        sample.stats = self.last_stats
        return sample


def _median(xs):
    return statistics.median(xs) if xs else None


def summarise(samples, prompt_names: dict[str, str]) -> list[dict]:
    """One row per scenario: speedups, per-drafter acceptance, pre-draft hits, bytes."""
    rows = []
    for scenario in dict.fromkeys(s.scenario for s in samples):
        mine = [s for s in samples if s.scenario == scenario]
        ratios = harness.ratios(samples, scenario, BASELINE)
        copy = [s for s in samples if prompt_names.get(s.prompt) in COPY_HEAVY]
        copy_ratios = harness.ratios(copy, scenario, BASELINE)
        code = [s for s in samples if prompt_names.get(s.prompt) in COPY_HEAVY + ("code",)]
        row = {"scenario": scenario, "tok_s": _median([s.tokens_per_s for s in mine]),
               "speedup": _median(ratios), "speedup_copy": _median(copy_ratios),
               "speedup_copy_code": _median(harness.ratios(code, scenario, BASELINE)),
               "per_prompt": {prompt_names[p]: round(_median(
                   harness.ratios([s for s in samples if s.prompt == p], scenario,
                                  BASELINE)) or 0, 3) for p in prompt_names}}
        stats = [s.stats for s in mine if getattr(s, "stats", None) is not None]
        if stats:
            total = {f: sum(getattr(st, f) for st in stats) for f in (
                "rounds", "drafted_tokens", "accepted_tokens", "lookup_rounds",
                "lookup_drafted_tokens", "lookup_accepted_tokens", "pipelined_rounds",
                "predrafts_wasted", "guess_rounds", "guess_rejections", "guess_bonus_misses")}
            model_drafted = total["drafted_tokens"] - total["lookup_drafted_tokens"]
            model_accepted = total["accepted_tokens"] - total["lookup_accepted_tokens"]
            row.update(total)
            row["lookup_acceptance"] = _rate(total["lookup_accepted_tokens"],
                                             total["lookup_drafted_tokens"])
            row["model_acceptance"] = _rate(model_accepted, model_drafted)
            row["lookup_round_share"] = _rate(total["lookup_rounds"], total["rounds"])
            row["all_accepted_hit_rate"] = _rate(
                total["pipelined_rounds"], total["pipelined_rounds"] + total["predrafts_wasted"])
            row["guess_rejected"] = _rate(total["guess_rejections"], total["guess_rounds"])
            row["guess_other_bonus"] = _rate(total["guess_bonus_misses"],
                                             total["guess_rounds"])
            row["bytes_per_round"] = sum(s.wire_bytes for s in mine) / max(
                1, sum(s.rounds for s in mine))
        rows.append(row)
    return rows


def greedy_mismatches(samples: list[Sample], ours: list[str],
                      prompt_names: dict[str, str]) -> tuple[list[str], list[str]]:
    """Greedy samples whose ids differ from target-only's for the same prompt and
    repeat: specdec's (a failure of exactness) and the peers' that report their ids
    (GenAI's; a peer that continued other text makes its row a comparison on other
    text). Samples without ids are not judged."""
    ref = {(s.prompt, s.repeat): s.token_ids for s in samples if s.scenario == BASELINE}
    differ = [s for s in samples if s.scenario != BASELINE and s.token_ids
              and s.token_ids != ref.get((s.prompt, s.repeat))]

    def name(s: Sample) -> str:
        return f"{s.scenario} on {prompt_names[s.prompt]} (repeat {s.repeat})"

    return ([name(s) for s in differ if s.scenario in ours],
            [name(s) for s in differ if s.scenario not in ours])


def _rate(a, b):
    return a / b if b else None


def against_peers(samples, ours: list[str], peers: list[str]) -> list[dict]:
    """specdec's tok/s over each peer's, per prompt and repeat, median."""
    return [{"specdec": o, "peer": p, "ratio": _median(harness.ratios(samples, o, p))}
            for o in ours for p in peers]


def _fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def markdown(rows, peer_rows, meta) -> str:
    out = [f"- **Command:** `{meta['command']}` ({meta['date']})",
           f"- **Machine:** {meta['machine']}",
           f"- **Set-up:** {meta['prompts']} prompts x {meta['max_new_tokens']} new tokens, "
           f"{meta['repeats']} repeat(s), temperature {meta['temperature']}; services pinned "
           "(draft on one core, target on the other), one thread each, f32 target",
           f"- **Speedup:** {harness.SPEEDUP_DEFINITION}", "",
           "| scenario | tok/s | speedup, all prompts | extraction + summarisation | "
           "+ code | look-up rounds | look-up acceptance | model acceptance | "
           "all-accepted pre-draft hits | its rounds: a rejection / another bonus | "
           "bytes/round |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['scenario']} | {_fmt(r['tok_s'], '.1f')} | {_fmt(r['speedup'], '.2f', 'x')}"
            f" | {_fmt(r['speedup_copy'], '.2f', 'x')} | "
            f"{_fmt(r['speedup_copy_code'], '.2f', 'x')} | "
            f"{_fmt(r.get('lookup_round_share'), '.0%')} | "
            f"{_fmt(r.get('lookup_acceptance'))} | {_fmt(r.get('model_acceptance'))} | "
            f"{_fmt(r.get('all_accepted_hit_rate'))} | {_fmt(r.get('guess_rejected'))} / "
            f"{_fmt(r.get('guess_other_bonus'))} | {_fmt(r.get('bytes_per_round'), '.0f')} |")
    names = list(rows[0]["per_prompt"]) if rows else []
    out += ["", "Speedup per prompt (median over repeats):", "",
            "| scenario | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in rows:
        if r["scenario"] != BASELINE:
            out.append(f"| {r['scenario']} | " + " | ".join(
                f"{r['per_prompt'][n]:.2f}x" for n in names) + " |")
    if peer_rows:
        out += ["", "specdec against OpenVINO GenAI (specdec tok/s over the peer's, median "
                "of per-prompt ratios):", "", "| specdec | peer | ratio |", "|---|---|---|"]
        out += [f"| {p['specdec']} | {p['peer']} | {_fmt(p['ratio'], '.2f', 'x')} |"
                for p in peer_rows]
    if meta.get("failed"):
        out += [""] + [f"Failed and skipped: {k}: {v}" for k, v in meta["failed"].items()]
    if meta.get("mismatches"):
        out += [""] + [f"NOT EXACT: {m}" for m in meta["mismatches"]]
    if meta.get("peers_checked"):
        differ = meta.get("peer_mismatches", [])
        out += ["", "Every GenAI text equals target-only's, token for token: "
                + ("yes." if not differ else "no: " + "; ".join(differ))]
    return "\n".join(out) + "\n"


def plot(rows, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = [r for r in rows if r["scenario"] != BASELINE and r["per_prompt"]]
    names = list(spec[0]["per_prompt"]) if spec else []
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(spec))
    for i, r in enumerate(spec):
        ax.bar([j + i * width for j in range(len(names))],
               [r["per_prompt"][n] for n in names], width, label=r["scenario"])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=20)
    ax.set_ylabel("speedup over target-only")
    ax.set_title("who drafts: speedup per prompt (greedy)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> int:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import pair as pairs
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export
    from specdec_tools.bench import peers as peer_setups
    from specdec_tools.bench.harness import machine

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    chosen = [n for n, _ in bench_prompts.PROMPTS] if not args.prompts else \
        [x.strip() for x in args.prompts.split(",")]
    unknown = [n for n in chosen if n not in dict(bench_prompts.PROMPTS)]
    if unknown:
        say(f"error: unknown prompt(s) {', '.join(unknown)}; shipped: "
            f"{', '.join(n for n, _ in bench_prompts.PROMPTS)}")
        return 2
    messages = [m for n, m in bench_prompts.PROMPTS if n in chosen]
    prompt_names = {m: n for n, m in bench_prompts.PROMPTS if n in chosen}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    say("== preparing the model and its OpenVINO IRs (cached)")
    hf = prepare_smollm2()
    target_ir, draft_ir = export(hf, "fp32", say=say), export(hf, "int8", say=say)
    pair = pairs.DEFAULT_PAIR.with_models(args.model, args.model).with_threads(1)
    pair = pairs.Pair(pair.name, pair.target.with_(inference_precision="f32"), pair.draft)
    failed: dict[str, str] = {}
    with ExitStack() as stack:
        say("== starting target and draft services (pinned)")
        running = pairs.start(pair, stack, pin=True)
        addresses = dict(target=running.target.address, draft=running.draft.address)
        scenarios = [StatsScenario(build_service(CoordinatorConfig(
            **addresses, drafter="model")), 0)]
        for key in [x.strip() for x in args.scenarios.split(",") if x.strip()]:
            label, options = SCENARIOS[key]
            scenarios.append(StatsScenario(build_service(CoordinatorConfig(
                **{**addresses, **options})), args.k, label))
        peer_list = []
        for setup in [x for x in args.peer_setups.split(",") if x]:
            for kind in PEER_KINDS:
                try:
                    peer_list.append(peer_setups.PeerProcess(
                        kind, peer_setups.SETUPS[setup], running.cpus["target"],
                        dict(target_ir=str(target_ir), draft_ir=str(draft_ir), hf=str(hf),
                             k=args.k, precision="f32")))
                except (RuntimeError, TimeoutError, ImportError) as exc:
                    say(f"note: peer {kind} ({setup}) skipped: {exc}")
        say(f"speedup: {harness.SPEEDUP_DEFINITION}")
        try:
            samples = harness.run_side_by_side(
                scenarios + peer_list, messages, args.max_new_tokens, args.repeats,
                [args.temperature], failed=failed, desc="bench-drafters", say=say)
        finally:
            for peer in peer_list:
                peer.close()
    rows = summarise(samples, prompt_names)
    ours = [sc.name for sc in scenarios[1:]]
    peer_rows = against_peers(samples, ours, [p.name for p in peer_list])
    mismatches, peer_mismatches = greedy_mismatches(samples, ours, prompt_names) \
        if args.temperature == 0 else ([], [])
    meta = {"command": " ".join(["specdec"] + sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
            "machine": machine(), "prompts": len(messages),
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "temperature": args.temperature, "k": args.k, "failed": failed,
            "mismatches": mismatches, "peer_mismatches": peer_mismatches,
            "peers_checked": bool(peer_list) and args.temperature == 0,
            "speedup_definition": harness.SPEEDUP_DEFINITION}
    md = markdown(rows, peer_rows, meta)
    (out_dir / "drafters.md").write_text(md)
    (out_dir / "drafters.json").write_text(json.dumps(
        {"meta": meta, "rows": rows, "peers": peer_rows}, indent=1))
    png = plot(rows, out_dir / "drafters_speedup.png")
    print(md)
    say(f"wrote {out_dir / 'drafters.json'}, {out_dir / 'drafters.md'}, {png}")
    if mismatches:
        say("FAILURE: greedy output differs from target-only: " + "; ".join(mismatches))
        return 1
    return 0


def add_parser(sub) -> None:
    from specdec_tools.bench.peers import SETUPS

    p = sub.add_parser(
        "bench-drafters", help="who drafts: look-up, draft model, hybrid, and GenAI",
        description="Target-only, the model-free look-up with no draft service, the draft "
                    "model pipelined and the hybrid pipelined, through the real services "
                    "on the shipped prompts, interleaved, beside OpenVINO GenAI's "
                    "speculative and prompt-lookup pipelines; writes drafters.json, "
                    "drafters.md and drafters_speedup.png. Greedy runs check every text "
                    "against target-only (exit 1 otherwise). " + harness.SPEEDUP_DEFINITION)
    p.add_argument("--scenarios", default=DEFAULT_SCENARIOS,
                   help=f"comma-separated among {', '.join(SCENARIOS)} "
                        "(default: %(default)s)")
    p.add_argument("--prompts", default="",
                   help="comma-separated shipped prompt names (default: all eight)")
    p.add_argument("--k", type=int, default=4,
                   help="draft tokens per model round, and GenAI's K (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=96,
                   help="tokens per generation (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2,
                   help="passes over the prompts (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy, checked against target-only (default: %(default)s)")
    p.add_argument("--peer-setups", default=",".join(SETUPS),
                   help="GenAI's set-ups, comma-separated among " + ", ".join(SETUPS)
                        + "; empty = no peers (default: %(default)s)")
    p.add_argument("--model", default="smollm2-135m", help="model (default: %(default)s)")
    p.add_argument("--out", default="bench-results",
                   help="folder for the results (default: %(default)s)")
    p.set_defaults(func=run)
