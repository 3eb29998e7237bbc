"""`specdec bench`: run the scenarios side by side and write JSON, Markdown and plots."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from specdec_tools.bench import harness, report
from specdec_tools.bench import prompts as bench_prompts
from specdec_tools.bench.harness import comma_list as _list
from specdec_tools.bench.harness import machine


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(args: argparse.Namespace) -> int:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import pair as pairs
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export
    from specdec_tools.bench import peers as peer_setups
    from specdec_tools.bench.system import SystemScenario

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    ks = [int(k) for k in _list(args.k)]
    temps = [float(t) for t in _list(args.temperatures)]
    names = bench_prompts.QUICK if args.quick else [n for n, _ in bench_prompts.PROMPTS]
    messages = [m for n, m in bench_prompts.PROMPTS if n in names]
    peers = set(_list(args.peers))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    say("== preparing the models and their OpenVINO IRs (cached)")
    draft_hf = None  # the peers' draft folder: none = the target's own, quantized
    ggufs: dict = {}  # llama.cpp's files: a pair prepared from GGUFs
    if args.pair == "smollm2":
        hf = prepare_smollm2()
        target_ir, draft_ir = export(hf, "fp32", say=say), export(hf, "int8", say=say)
        pair = pairs.DEFAULT_PAIR.with_models(args.model, args.model)
    else:
        from specdec.model_pairs import PAIRS, prepare_pair
        from specdec.paths import model_dir
        from specdec_tools.bench import llamacpp_peer

        real = PAIRS[args.pair]
        irs = prepare_pair(real, log=say)
        target_ir, draft_ir = irs["target"], irs["draft"]
        hf, draft_hf = model_dir(real.target.name), model_dir(real.draft.name)
        ggufs = llamacpp_peer.gguf_options(args.pair)
        pair = pairs.SERVED[args.pair]
    pair = pair.with_threads(args.threads)
    pair = pairs.Pair(pair.name, pair.target.with_(inference_precision=args.precision),
                      pair.draft)
    k_pipe = 4 if 4 in ks else ks[-1]
    failed: dict[str, str] = {}  # "scenario @ temperature" -> error (a peer's, not ours)
    with ExitStack() as stack:
        say("== starting target and draft services")
        running = pairs.start(pair, stack, pin=args.pin)
        addresses = dict(target=running.target.address, draft=running.draft.address)

        def service(**options):  # sequential model-drafted rounds unless options say
            return build_service(CoordinatorConfig(**{**addresses, "pipeline": False,
                                                      "drafter": "model", **options}))

        system = service()
        scenarios = [SystemScenario(system, 0)] + [SystemScenario(system, k) for k in ks]
        for variant in _list(args.loops):
            label, options = LOOPS[variant]
            scenarios.append(SystemScenario(service(**options), k_pipe, label))
        say(f"speedup: {harness.SPEEDUP_DEFINITION}")

        def include(scenario, temperature: float) -> bool:
            # sampled runs: target-only, the default K, its loop variants and GenAI (time)
            if not temperature:
                return True
            if isinstance(scenario, SystemScenario):
                return scenario.k in (0, k_pipe)
            return getattr(scenario, "sampled", False)

        # One pass per peer set-up, each with its peers alone in memory (every peer is a
        # process holding its own model). Later passes rerun only target-only and specdec
        # as deployed beside their peers, so every peer has a baseline of its own pass.
        as_deployed = {f"specdec K={k_pipe}{LOOPS[v][0]}" for v in DEPLOYED}
        deployed = [sc for sc in scenarios if sc.k == 0 or sc.name in as_deployed]
        samples = []
        for i, setup in enumerate(_list(args.peer_setups) or [None]):
            peer_list = [] if setup is None else peer_setups.start_all(
                peers, [setup], running.cpus["target"],
                dict(target_ir=str(target_ir), draft_ir=str(draft_ir), hf=str(hf), k=k_pipe,
                     precision=args.precision, draft_hf=str(draft_hf) if draft_hf else None,
                     **ggufs),
                say)
            try:
                passed = harness.run_side_by_side(
                    (scenarios if i == 0 else deployed) + peer_list, messages,
                    args.max_new_tokens, args.repeats, temps, include=include, failed=failed,
                    desc=f"bench ({setup or 'no peers'})", say=say)
            finally:
                for peer in peer_list:
                    peer.close()
            for sample in passed:
                sample.repeat += i * args.repeats  # pairs stay within their pass
            samples += passed
        rtt_rows = []
        if args.rtt:
            from specdec_tools.bench import rtt as rtt_sweep

            rtts = [float(x) for x in _list(args.rtt)]
            say(f"== RTT sweep {rtts} ms, sequential vs pipelined")
            # With namespaces permitted, the sweep starts its own pair in them (the RTT on
            # real links); this pair idles meanwhile. Else in-client sleeps on this one.
            rtt_rows = rtt_sweep.sweep(addresses["target"], addresses["draft"], rtts,
                                       messages, k_pipe, args.max_new_tokens,
                                       progress=lambda xs: tqdm(xs, desc="rtt", unit="rtt"),
                                       pair=pair, pin=args.pin, say=say)
        rss = {role: _peak_rss_mb(p.proc.pid) for role, p in running.processes().items()}
    rows = [r for t in temps for r in report.summarise([s for s in samples
                                                        if s.temperature == t], t)]
    meta = {"machine": machine(),
            "model": f"{args.model} (OpenVINO fp32 target computing in {args.precision}, int8 "
                     "draft)" if args.pair == "smollm2" else
                     f"{pair.name}, the target computing in {args.precision}",
            "precision": args.precision,
            "prompts": len(messages), "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "pinned": running.pinned,
            "threads_per_service": args.threads,
            "target_args": pair.target.args(0, running.cpus["target"]),
            "draft_args": pair.draft.args(0, running.cpus["draft"]),
            "peer_setups": {k: peer_setups.SETUPS[k].label for k in _list(args.peer_setups)},
            "speedup_definition": harness.SPEEDUP_DEFINITION,
            "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
            "peak_rss_mb": rss, "failed": failed}
    md = report.markdown(rows, meta)
    if rtt_rows:
        from specdec_tools.bench import rtt as rtt_sweep

        md += "\n" + rtt_sweep.markdown(rtt_rows, k_pipe)
        meta["rtt_sweep"] = rtt_sweep.as_dicts(rtt_rows)
    (out_dir / "bench.md").write_text(md)
    report.write_json(out_dir / "bench.json", rows, meta)
    files = report.plots(rows, out_dir)
    if rtt_rows:
        files.append(rtt_sweep.plot(rtt_rows, out_dir / "speedup_vs_rtt.png"))
    print(md)
    say(f"wrote {out_dir / 'bench.json'}, {out_dir / 'bench.md'}, "
        + ", ".join(str(f) for f in files))
    # A peer's text that differs (GenAI in bf16) is reported in the table, not a failure.
    bad = [r.scenario for r in rows if r.exact is False and r.system]
    if bad:
        print(f"FAILURE: greedy speculative output differs from target-only in: "
              f"{', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


# --loops: name -> (scenario label, CoordinatorConfig options); the K sweep is sequential
LOOPS = {
    "pipelined": (" pipelined", dict(pipeline=True)),
    "hybrid": (" hybrid pipelined", dict(pipeline=True, drafter="hybrid")),
    "lookup": (" model-free, no draft service", dict(draft="", drafter="lookup")),
    "pipelined-exit": (" pipelined + confidence exit", dict(pipeline=True, confidence_exit=True)),
    "pipelined-adaptive": (" pipelined + adaptive K", dict(pipeline=True, adaptive_k=True)),
    "exit": (" + confidence exit", dict(pipeline=False, confidence_exit=True)),
    "adaptive": (" + adaptive K", dict(pipeline=False, adaptive_k=True)),
}
DEPLOYED = ("pipelined", "hybrid")  # the loops rerun beside every peer set-up


def add_parser(sub) -> None:
    from specdec_tools.bench.peers import SETUPS

    p = sub.add_parser(
        "bench", help="specdec vs target-only and in-process peers, side by side",
        description="Run target-only and speculative decoding through the real services "
                    "(K sweep) and in-process peers (the target backend alone, OpenVINO "
                    "GenAI plain/speculative/prompt lookup, HF transformers plain/assisted) "
                    "on the shipped prompts, interleaved, and write JSON, Markdown and PNG "
                    "plots. Greedy runs check that every speculative text equals "
                    "target-only (exit 1 otherwise). " + harness.SPEEDUP_DEFINITION + ". "
                    "With --report, only rewrite the docs' tables from a results JSON.")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke: 2 prompts, K=4, 32 tokens, one repeat, greedy, no HF, "
                        "peers in the same-target-device set-up only (under 3 minutes)")
    p.add_argument("--k", default="1,2,3,4,6,8",
                   help="K sweep, sequential rounds (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2,
                   help="passes over the prompts (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens per generation (default: %(default)s)")
    p.add_argument("--temperatures", default="0,0.7",
                   help="comma-separated; 0 = greedy (default: %(default)s)")
    p.add_argument("--peers", default="inprocess,genai,hf",
                   help="comma-separated among inprocess, genai, hf, llamacpp (llama.cpp's "
                        "server on the pair's GGUF files, plain and with the draft on -md; "
                        "--pair qwen2.5-coder only; `make llamacpp` builds it, else it is "
                        "skipped with a note) (default: %(default)s)")
    p.add_argument("--peer-setups", default=",".join(SETUPS),
                   help="set-ups each peer runs in, comma-separated: " + "; ".join(
                       f"{k} = {s.label}" for k, s in SETUPS.items())
                   + " (default: %(default)s)")
    p.add_argument("--pin", dest="pin", action="store_true", default=True,
                   help="run the draft and the target on separate CPUs (the default when "
                        "there are two)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="let the draft and the target share all CPUs")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per model service (default: %(default)s)")
    p.add_argument("--model", default="smollm2-135m", help="model (default: %(default)s)")
    p.add_argument("--precision", default="f32", choices=["f32", "bf16", "f16", "auto"],
                   help="what the target computes in, for specdec's target service and for "
                        "every in-process peer's target alike (OpenVINO's CPU default is "
                        "bf16 where the CPU has it; GenAI's out-of-the-box precision gets "
                        "its own labelled row); drafts use their defaults "
                        "(default: %(default)s)")
    p.add_argument("--loops", default="pipelined,hybrid,lookup,pipelined-exit,"
                                      "pipelined-adaptive",
                   help="loop variants run at K=4 besides the sequential K sweep, among "
                        f"{', '.join(LOOPS)}; empty = none (default: %(default)s)")
    p.add_argument("--rtt", default="0,1,5,20",
                   help="round-trip times (ms) for the sequential vs pipelined sweep, added "
                        "on network-namespace links where namespaces can be made (netem or "
                        "a delaying proxy; specdec_tools.netns.network), else as sleeps in the "
                        "coordinator's clients; empty = skip (default: %(default)s)")
    p.add_argument("--out", default="bench-results",
                   help="folder for bench.json, bench.md and the plots (default: %(default)s)")
    p.add_argument("--interactive", action="store_true",
                   help="the server's drafting decision through `specdec up`'s defaults: one "
                        "request at a time on general, grounded and code prompts with the "
                        "server's K, K=0 and every fixed K in --ks, then the load sweep "
                        "(--concurrency) beside GenAI's continuous batching; writes "
                        "interactive.json, interactive.md and interactive.png "
                        "(specdec_tools.bench.interactive)")
    p.add_argument("--report", metavar="JSON",
                   help="run nothing: rewrite the generated tables (between <!-- bench:NAME "
                        "--> markers) in README.md and docs/benchmarks.md from this results "
                        "file, e.g. docs/bench-latest.json")

    def main(args) -> int:
        if args.report:
            from specdec_tools.bench import docs

            for path in docs.write(Path(args.report)):
                print(f"rewrote {path}")
            return 0
        unknown = [v for v in _list(args.loops) if v not in LOOPS]
        unknown += [v for v in _list(args.peer_setups) if v not in SETUPS]
        if unknown:
            p.error(f"unknown --loops or --peer-setups value(s): {', '.join(unknown)}; "
                    f"loops: {', '.join(LOOPS)}; set-ups: {', '.join(SETUPS)}")
        if args.interactive:
            from specdec_tools.bench import interactive

            return interactive.run(args)
        if args.quick:
            args.k, args.repeats, args.max_new_tokens = "4", 1, 32
            args.temperatures, args.peers, args.rtt = "0", "inprocess,genai", "0,20"
            args.loops, args.peer_setups = "pipelined,hybrid,lookup", "target-device"
        return run(args)

    from specdec_tools.bench.interactive import add_arguments

    add_arguments(p)
    p.set_defaults(func=main)
