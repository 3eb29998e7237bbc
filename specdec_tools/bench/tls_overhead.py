"""`specdec bench-tls`: what mutual TLS between the coordinator and the model services costs
per round, measured side by side.

Two copies of the default pair run at once, pinned alike (draft on the first CPU, target on
the second): one plaintext, one with mutual TLS (development certificates from
specdec.certs, made for the run). The coordinator's loop runs in this process against each
(coordinator.deploy.setup.build_service, as `specdec bench` does), and the harness interleaves the
scenarios prompt by prompt, so both see the same machine state. Reported, per scenario:
median tokens/s, median seconds per round (one Propose + one Verify; target-only: one
Verify per token), median Propose and Verify call latency, and the mTLS/plaintext ratios.
TLS adds ~22 bytes per TLS 1.3 record (5 header, 1 content type, 16 AEAD tag) on top of
the protobuf and HTTP/2 bytes, which the wire counters below do not see.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from specdec_tools.bench import harness
from specdec_tools.bench import prompts as bench_prompts

PLAIN, MTLS = "plaintext", "mTLS"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(samples: list, names: dict[str, tuple[str, int]]) -> list[dict]:
    """One row per scenario: {scenario, transport, k, tokens_per_s, ms_per_round,
    propose_ms, verify_ms}, medians over the samples."""
    rows = []
    for name, (transport, k) in names.items():
        own = [s for s in samples if s.scenario == name]
        rows.append({
            "scenario": name, "transport": transport, "k": k,
            "tokens_per_s": _median([s.tokens_per_s for s in own]),
            "ms_per_round": _median([1000 * s.seconds / s.rounds for s in own if s.rounds]),
            "propose_ms": _median([1000 * x for s in own for x in s.propose_s]),
            "verify_ms": _median([1000 * x for s in own for x in s.verify_s]),
            "samples": len(own)})
    return rows


def compare(rows: list[dict]) -> list[dict]:
    """Per K: mTLS over plaintext (tokens/s ratio, extra ms per round and per call)."""
    out = []
    for k in sorted({r["k"] for r in rows}):
        plain = next(r for r in rows if r["k"] == k and r["transport"] == PLAIN)
        tls = next(r for r in rows if r["k"] == k and r["transport"] == MTLS)

        def diff(key, plain=plain, tls=tls):
            if plain[key] is None or tls[key] is None:
                return None
            return tls[key] - plain[key]

        out.append({"k": k, "tokens_per_s_ratio": tls["tokens_per_s"] / plain["tokens_per_s"],
                    "extra_ms_per_round": diff("ms_per_round"),
                    "extra_propose_ms": diff("propose_ms"), "extra_verify_ms": diff("verify_ms")})
    return out


def markdown(rows: list[dict], deltas: list[dict], meta: dict) -> str:
    def ms(x):
        return "-" if x is None else f"{x:.2f}"

    out = ["### mTLS between the coordinator and the model services, per round", "",
           f"{meta['prompts']} prompts x {meta['repeats']} repeats, {meta['max_new_tokens']} "
           f"new tokens, greedy, one run, medians; {meta['machine']}.", "",
           "| scenario | transport | tok/s | ms per round | Propose ms | Verify ms |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| K={r['k']} | {r['transport']} | {r['tokens_per_s']:.1f} | "
                   f"{ms(r['ms_per_round'])} | {ms(r['propose_ms'])} | {ms(r['verify_ms'])} |")
    out += ["", "| K | mTLS / plaintext tok/s | extra ms per round | extra ms per Propose | "
            "extra ms per Verify |", "|---|---|---|---|---|"]
    for d in deltas:
        out.append(f"| {d['k']} | {d['tokens_per_s_ratio']:.3f} | "
                   f"{ms(d['extra_ms_per_round'])} | {ms(d['extra_propose_ms'])} | "
                   f"{ms(d['extra_verify_ms'])} |")
    out += ["", f"Command: `{meta['command']}`"]
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import certs
    from specdec import pair as pairs
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export
    from specdec.stack import coordinator_client_tls, with_service_tls
    from specdec_tools.bench.harness import machine
    from specdec_tools.bench.system import SystemScenario

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    ks = sorted({0, args.k})
    messages = [m for n, m in bench_prompts.PROMPTS if n in bench_prompts.QUICK] \
        if args.quick else [m for _, m in bench_prompts.PROMPTS]
    say("== preparing the model and its OpenVINO IRs (cached)")
    hf = prepare_smollm2()
    export(hf, "fp32", say=say)
    export(hf, "int8", say=say)
    with ExitStack() as stack:
        pki_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="specdec-bench-tls-"))
        paths = certs.make_dev_certs(Path(pki_dir), days=1)
        say("== starting a plaintext pair and an mTLS pair (pinned alike)")
        running = {PLAIN: pairs.start(pairs.DEFAULT_PAIR, stack, pin=args.pin),
                   MTLS: pairs.start(with_service_tls(pairs.DEFAULT_PAIR, paths), stack,
                                     pin=args.pin)}
        client = coordinator_client_tls(paths)
        scenarios, names = [], {}
        for transport, pair_run in running.items():
            service = build_service(CoordinatorConfig(
                target=pair_run.target.address, draft=pair_run.draft.address,
                pipeline=args.pipeline, drafter="model", **(client if transport == MTLS else {})))
            for k in ks:
                sc = SystemScenario(service, k)
                sc.name = f"K={k} {transport}"
                scenarios.append(sc)
                names[sc.name] = (transport, k)
        say(f"== {len(scenarios)} scenarios side by side over {len(messages)} prompts")
        samples = harness.run_side_by_side(scenarios, messages, args.max_new_tokens,
                                           args.repeats, warmup=True, desc="bench-tls", say=say)
    if any(s.token_ids != samples[0].token_ids for s in samples
           if s.prompt == samples[0].prompt):
        say("error: outputs differ between transports or K (greedy must be identical)")
        return 1
    rows = summarise(samples, names)
    deltas = compare(rows)
    meta = {"machine": machine(), "prompts": len(messages), "repeats": args.repeats,
            "max_new_tokens": args.max_new_tokens, "pipeline": args.pipeline,
            "command": " ".join(["specdec", *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, deltas, meta)
    (out / "bench-tls.md").write_text(md)
    (out / "bench-tls.json").write_text(json.dumps(
        {"meta": meta, "rows": rows, "mtls_vs_plaintext": deltas}, indent=2))
    print(md)
    say(f"wrote {out / 'bench-tls.md'} and {out / 'bench-tls.json'}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-tls", help="what mTLS to the model services costs per round",
        description="Run a plaintext and an mTLS copy of the default pair side by side and "
                    "report tokens/s, time per round and per Propose/Verify call of each, "
                    "and the mTLS/plaintext ratios (JSON and Markdown in --out).")
    p.add_argument("--k", type=int, default=4,
                   help="draft tokens per round of the speculative scenarios; K=0 "
                        "(target-only) always runs too (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens per generation (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved runs of every prompt and scenario (default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="the bench's short prompt list instead of all prompts")
    p.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=False,
                   help="pipelined rounds (default: sequential, so a round is exactly one "
                        "Propose then one Verify)")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="pin drafts to the first CPU and targets to the second "
                        "(default: %(default)s)")
    p.add_argument("--out", default="bench-results",
                   help="folder for bench-tls.json and bench-tls.md (default: %(default)s)")
    p.set_defaults(func=lambda args: run(args))
