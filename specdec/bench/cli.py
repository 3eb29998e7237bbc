"""`specdec bench`: run the scenarios side by side and write JSON, Markdown and plots."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from specdec.bench import prompts as bench_prompts
from specdec.bench import report
from specdec.sampling import SamplingParams


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine() -> str:
    return (f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, "
            f"{platform.processor() or platform.system()}, Python {platform.python_version()}")


def run(args: argparse.Namespace) -> int:
    from coordinator.config import CoordinatorConfig
    from coordinator.setup import build_service
    from specdec import launcher
    from specdec.bench.scenarios import SystemScenario
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export
    from specdec.stack import DRAFT_ARGS, TARGET_ARGS

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    ks = [int(k) for k in args.k.split(",") if k.strip()]
    temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
    names = bench_prompts.QUICK if args.quick else [n for n, _ in bench_prompts.PROMPTS]
    messages = [(n, m) for n, m in bench_prompts.PROMPTS if n in names]
    peers = {p.strip() for p in args.peers.split(",") if p.strip()}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    say("== preparing the model and its OpenVINO IRs (cached)")
    hf = prepare_smollm2()
    target_ir, draft_ir = export(hf, "fp32", say=say), export(hf, "int8", say=say)
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin and len(cpus) >= 2
    with ExitStack() as stack:
        say("== starting target and draft services" + (" (pinned)" if pin else ""))
        procs = {}
        for role, module, flags, cpu in (("target", "target_service", TARGET_ARGS, cpus[-1]),
                                         ("draft", "draft_service", DRAFT_ARGS, cpus[0])):
            a = ["--model", args.model, "--port", "0", "--threads", str(args.threads), *flags]
            if role == "target":
                a += ["--inference-precision", args.precision]
            if pin:
                a += ["--cpus", str(cpu)]
            procs[role] = launcher.start(module, a, timeout=300)
            stack.callback(procs[role].stop)
        service = build_service(CoordinatorConfig(target=procs["target"].address,
                                                  draft=procs["draft"].address))
        scenarios = _scenarios(service, ks, peers, target_ir, draft_ir, hf, args, say)
        k_pipe = 4 if 4 in ks else ks[-1]
        for i, variant in enumerate(v for v in args.loops.split(",") if v.strip()):
            label, options = LOOPS[variant.strip()]
            loop = build_service(CoordinatorConfig(target=procs["target"].address,
                                                   draft=procs["draft"].address, **options))
            scenarios.insert(len(ks) + 1 + i, SystemScenario(loop, k_pipe, label))
        samples: dict[float, list] = {t: [] for t in temps}
        failed: dict[str, str] = {}  # "scenario @ temperature" -> error (a peer's, not ours)
        jobs = [(rep, t, m) for rep in range(args.repeats) for t in temps for m in messages]
        for rep, temperature, (_, message) in tqdm(jobs, desc="bench", unit="prompt"):
            sampling = SamplingParams(temperature=temperature, seed=rep)
            for scenario in scenarios:
                key = f"{scenario.name} @ temperature {temperature}"
                if (temperature and not _sampled(scenario, ks)) or key in failed:
                    continue  # sampled runs: target-only, default K and GenAI only (time)
                try:
                    samples[temperature].append(
                        scenario.run(message, args.max_new_tokens, sampling))
                except Exception as exc:  # noqa: BLE001 - a peer's failure is a finding
                    if not isinstance(scenario, SystemScenario):
                        failed[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                        say(f"note: {key} failed and is skipped from now on: {failed[key]}")
                        continue
                    raise
        rtt_rows = []
        if args.rtt:
            from specdec.bench import rtt as rtt_sweep

            rtts = [float(x) for x in args.rtt.split(",") if x.strip()]
            say(f"== RTT sweep {rtts} ms, sequential vs pipelined")
            rtt_rows = rtt_sweep.sweep(procs["target"].address, procs["draft"].address, rtts,
                                       [m for _, m in messages], k_pipe, args.max_new_tokens,
                                       progress=lambda xs: tqdm(xs, desc="rtt", unit="rtt"))
        rss = {role: _peak_rss_mb(p.proc.pid) for role, p in procs.items()}
    rows = [r for t in temps for r in report.summarise(samples[t], t)]
    meta = {"machine": machine(),
            "model": f"{args.model} (OpenVINO fp32 target computing in {args.precision}, int8 "
                     "draft)",
            "precision": args.precision,
            "prompts": len(messages), "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "pinned": pin, "threads_per_service": args.threads,
            "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
            "peak_rss_mb": rss, "failed": failed}
    md = report.markdown(rows, meta)
    if rtt_rows:
        from specdec.bench import rtt as rtt_sweep

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
    bad = [r.scenario for r in rows if r.exact is False]
    if bad:
        print(f"FAILURE: greedy speculative output differs from target-only in: "
              f"{', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


# --loops: name -> (scenario label, CoordinatorConfig options)
LOOPS = {
    "pipelined": (" pipelined", dict(pipeline=True)),
    "pipelined-exit": (" pipelined + confidence exit", dict(pipeline=True, confidence_exit=True)),
    "pipelined-adaptive": (" pipelined + adaptive K", dict(pipeline=True, adaptive_k=True)),
    "exit": (" + confidence exit", dict(confidence_exit=True)),
    "adaptive": (" + adaptive K", dict(adaptive_k=True)),
}


def _sampled(scenario, ks) -> bool:
    from specdec.bench.scenarios import GenAIScenario, SystemScenario

    if isinstance(scenario, SystemScenario):
        return scenario.k in (0, 4 if 4 in ks else ks[-1])
    return isinstance(scenario, GenAIScenario) and scenario.mode != "lookup"


def _scenarios(service, ks, peers, target_ir, draft_ir, hf, args, say):
    from specdec.bench.scenarios import GenAIScenario, HFScenario, InProcessTarget, SystemScenario

    scenarios = [SystemScenario(service, 0)] + [SystemScenario(service, k) for k in ks]
    tokenizer = service.tokenizer
    k_peer = 4 if 4 in ks else ks[-1]
    if "inprocess" in peers:
        from specdec.runtime.openvino_backend import OpenVINOBackend

        backend = OpenVINOBackend(target_ir, "CPU", threads=args.threads,
                                  inference_precision=args.precision)
        scenarios.append(InProcessTarget(backend, tokenizer, service.eos_token_ids))
    if "genai" in peers:
        try:
            for mode in ("plain", "speculative", "lookup"):
                scenarios.append(GenAIScenario(target_ir, draft_ir, mode, k_peer,
                                               args.threads, tokenizer, args.precision))
        except ImportError:
            say("note: openvino-genai is not installed; skipping its scenarios")
    if "hf" in peers:
        from specdec.runtime.models import load, quantize_int8

        target = load(str(hf)).model
        draft = load(str(hf))
        quantize_int8(draft)
        plain, assisted = HFScenario(target, None, k_peer, tokenizer), \
            HFScenario(target, draft.model, k_peer, tokenizer)
        scenarios += [plain, assisted]
    return scenarios


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="specdec vs target-only and in-process peers, side by side",
        description="Run target-only and speculative decoding through the real services "
                    "(K sweep) and in-process peers (the target backend alone, OpenVINO "
                    "GenAI plain/speculative/prompt lookup, HF transformers plain/assisted) "
                    "on the shipped prompts, interleaved, and write JSON, Markdown and PNG "
                    "plots. Greedy runs check that every speculative text equals "
                    "target-only (exit 1 otherwise).")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke: 2 prompts, K=4, 32 tokens, one repeat, greedy, no HF "
                        "(under 3 minutes)")
    p.add_argument("--k", default="1,2,3,4,6,8", help="K sweep (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2,
                   help="passes over the prompts (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens per generation (default: %(default)s)")
    p.add_argument("--temperatures", default="0,0.7",
                   help="comma-separated; 0 = greedy (default: %(default)s)")
    p.add_argument("--peers", default="inprocess,genai,hf",
                   help="comma-separated among inprocess, genai, hf (default: %(default)s)")
    p.add_argument("--pin", dest="pin", action="store_true", default=True,
                   help="run the draft and the target on separate CPUs (the default when "
                        "there are two)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="let the draft and the target share all CPUs")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per model service and per peer (default: %(default)s)")
    p.add_argument("--model", default="smollm2-135m", help="model (default: %(default)s)")
    p.add_argument("--precision", default="f32", choices=["f32", "bf16", "f16", "auto"],
                   help="what the target computes in, for specdec's target service and for "
                        "every in-process peer's target alike (OpenVINO's CPU default is "
                        "bf16 where the CPU has it); drafts use their defaults "
                        "(default: %(default)s)")
    p.add_argument("--loops", default="pipelined,pipelined-exit,pipelined-adaptive",
                   help="loop variants run at K=4 besides the sequential K sweep, among "
                        f"{', '.join(LOOPS)}; empty = none (default: %(default)s)")
    p.add_argument("--rtt", default="0,1,5,20",
                   help="injected round-trip times (ms) for the sequential vs pipelined sweep; "
                        "empty = skip (default: %(default)s)")
    p.add_argument("--out", default="bench-results",
                   help="folder for bench.json, bench.md and the plots (default: %(default)s)")

    def main(args) -> int:
        unknown = [v for v in args.loops.split(",") if v.strip() and v.strip() not in LOOPS]
        if unknown:
            p.error(f"--loops: unknown variant(s) {', '.join(unknown)}; choose among "
                    f"{', '.join(LOOPS)}")
        if args.quick:
            args.k, args.repeats, args.max_new_tokens = "4", 1, 32
            args.temperatures, args.peers, args.rtt = "0", "inprocess,genai", "0,20"
            args.loops = "pipelined"
        return run(args)

    p.set_defaults(func=main)
