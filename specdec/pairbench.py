"""`specdec bench-pairs`: choose the draft/target pair by measuring, side by side.

For each candidate pair, the target and draft services are started as processes (pinned
to separate cores, or not), and the same chat prompts are generated greedily with K and
with K=0 (target-only on the same target backend), interleaved, through the coordinator's
GenerationService in this process (Ray Serve is left out: it adds the same cost to
both). Reports median tokens/s, speedup, acceptance and whether every speculative text
equals its target-only twin.
"""

from __future__ import annotations

import json
import statistics
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass

from tqdm import tqdm

PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for a good night's sleep.",
]


@dataclass(frozen=True)
class Pair:
    name: str
    target: tuple[str, ...]  # flags for target_service
    draft: tuple[str, ...]  # flags for draft_service


CANDIDATES = [
    Pair("ov-fp32 target + ov-int8 draft",
         ("--backend", "openvino", "--weights", "fp32"),
         ("--backend", "openvino", "--weights", "int8")),
    Pair("ov-fp32 target + ov-int4 draft",
         ("--backend", "openvino", "--weights", "fp32"),
         ("--backend", "openvino", "--weights", "int4")),
    Pair("torch-fp32 target + ov-int8 draft",
         ("--backend", "torch"),
         ("--backend", "openvino", "--weights", "int8")),
    Pair("torch-fp32 target + torch-int8 draft",
         ("--backend", "torch"),
         ("--backend", "torch", "--quantize", "int8")),
]


@dataclass
class PairResult:
    pair: str
    pinned: bool
    k: int
    target_only_tokens_per_s: float
    speculative_tokens_per_s: float
    speedup: float
    acceptance: float  # accepted / drafted
    tokens_per_round: float
    exact: bool


def measure(pair: Pair, pinned: bool, k: int, max_new_tokens: int, repeats: int,
            model: str) -> PairResult:
    from coordinator.config import CoordinatorConfig
    from coordinator.setup import build_service
    from specdec import launcher
    from specdec.v1 import generate_pb2

    with ExitStack() as stack:
        procs = []
        for module, flags, cpu in (("target_service", pair.target, "1"),
                                   ("draft_service", pair.draft, "0")):
            args = ["--model", model, "--port", "0", "--threads", "1", *flags]
            if pinned:
                args += ["--cpus", cpu]
            proc = launcher.start(module, args, timeout=300)
            stack.callback(proc.stop)
            procs.append(proc)
        service = build_service(CoordinatorConfig(target=procs[0].address,
                                                  draft=procs[1].address))

        def run(prompt, kk):
            req = generate_pb2.GenerateRequest(max_new_tokens=max_new_tokens,
                                               num_draft_tokens=kk)
            req.messages.add(role="user", content=prompt)
            t0 = time.perf_counter()
            resp = service.generate(req)
            return resp, len(resp.token_ids) / (time.perf_counter() - t0)

        run(PROMPTS[0], k)  # warm-up
        run(PROMPTS[0], 0)
        base_tps, spec_tps = [], []
        drafted = accepted = rounds = tokens = 0
        exact = True
        for _ in range(repeats):
            for prompt in PROMPTS:
                spec, s = run(prompt, k)
                base, b = run(prompt, 0)
                spec_tps.append(s)
                base_tps.append(b)
                exact &= list(spec.token_ids) == list(base.token_ids)
                drafted += spec.stats.drafted_tokens
                accepted += spec.stats.accepted_tokens
                rounds += spec.stats.rounds
                tokens += len(spec.token_ids)
    b, s = statistics.median(base_tps), statistics.median(spec_tps)
    return PairResult(pair.name, pinned, k, b, s, s / b, accepted / max(drafted, 1),
                      tokens / max(rounds, 1), exact)


def table(results: list[PairResult]) -> str:
    lines = ["| pair | pinned | K | target-only tok/s | speculative tok/s | speedup | "
             "acceptance | tokens/round | exact |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.pair} | {'yes' if r.pinned else 'no'} | {r.k} | "
                     f"{r.target_only_tokens_per_s:.1f} | {r.speculative_tokens_per_s:.1f} | "
                     f"{r.speedup:.2f}x | {r.acceptance:.2f} | {r.tokens_per_round:.2f} | "
                     f"{'yes' if r.exact else 'NO'} |")
    return "\n".join(lines)


def run_all(k: int = 4, max_new_tokens: int = 64, repeats: int = 1,
            model: str = "smollm2-135m", pairs: list[str] | None = None,
            pin_modes: tuple[bool, ...] = (True, False)) -> list[PairResult]:
    chosen = [p for p in CANDIDATES if not pairs or any(s in p.name for s in pairs)]
    jobs = [(p, pin) for p in chosen for pin in pin_modes]
    results = []
    for pair, pin in tqdm(jobs, desc="pairs", unit="pair"):
        results.append(measure(pair, pin, k, max_new_tokens, repeats, model))
    return results


def add_parser(sub) -> None:
    p = sub.add_parser("bench-pairs", help="measure draft/target pairs side by side",
                       description=__doc__.split("\n\n")[0] + " Needs `specdec prepare "
                       "--openvino --weights fp32,int8,int4` for the real model.")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round (default: 4)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens per generation (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="passes over the prompts (default: %(default)s)")
    p.add_argument("--model", default="smollm2-135m", help="model (default: %(default)s)")
    p.add_argument("--pair", action="append",
                   help="only pairs whose name contains this text (repeatable)")
    p.add_argument("--no-unpinned", action="store_true", help="measure pinned runs only")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")

    def main(args) -> int:
        modes = (True,) if args.no_unpinned else (True, False)
        results = run_all(args.k, args.max_new_tokens, args.repeats, args.model, args.pair,
                          modes)
        print(table(results))
        if args.json:
            with open(args.json, "w") as f:
                json.dump([asdict(r) for r in results], f, indent=2)
        return 0 if all(r.exact for r in results) else 1

    p.set_defaults(func=main)
