"""`specdec bench-pairs`: choose the draft/target pair by measuring, side by side.

For each candidate pair (specdec.pair.CANDIDATES), the target and draft services are
started as processes (placed by specdec.pair.placement(), or not pinned), and the same
chat prompts are generated greedily with K and with K=0 (target-only on the same target
backend) through specdec_tools.bench.harness, interleaved, through the coordinator's
GenerationService in this process (Ray Serve is left out: it adds the same cost to
both). Reports median tokens/s, speedup (harness.SPEEDUP_DEFINITION), acceptance and
whether every speculative text equals its target-only twin.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import asdict, dataclass

from tqdm import tqdm

from specdec.pair import CANDIDATES, Pair
from specdec_tools.bench import harness

__all__ = ["CANDIDATES", "PROMPTS", "Pair", "PairResult", "measure", "run_all", "table"]

PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for a good night's sleep.",
]


@dataclass
class PairResult:
    pair: str
    pinned: bool
    k: int
    target_only_tokens_per_s: float
    speculative_tokens_per_s: float
    speedup: float  # harness.SPEEDUP_DEFINITION
    acceptance: float  # accepted / drafted
    tokens_per_round: float
    exact: bool


def measure(pair: Pair, pinned: bool, k: int, max_new_tokens: int, repeats: int,
            model: str) -> PairResult:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import pair as pairs
    from specdec_tools.bench.system import BASELINE, SystemScenario

    with ExitStack() as stack:
        running = pairs.start(pair.with_models(model, model), stack, pin=pinned)
        service = build_service(CoordinatorConfig(target=running.target.address,
                                                  draft=running.draft.address,
                                                  pipeline=False, drafter="model"))
        spec_sc = SystemScenario(service, k)
        samples = harness.run_side_by_side([spec_sc, SystemScenario(service, 0)], PROMPTS,
                                           max_new_tokens, repeats, warmup=True,
                                           desc=pair.name)
    spec = [s for s in samples if s.scenario == spec_sc.name]
    base = [s for s in samples if s.scenario == BASELINE]
    drafted, accepted = sum(s.drafted for s in spec), sum(s.accepted for s in spec)
    rounds, tokens = sum(s.rounds for s in spec), sum(s.tokens for s in spec)
    exact = all(s.token_ids == b.token_ids for s, b in zip(spec, base, strict=True))
    return PairResult(pair.name, running.pinned, k, harness.median_tps(samples, BASELINE),
                      harness.median_tps(samples, spec_sc.name),
                      harness.speedup(samples, spec_sc.name, BASELINE),
                      accepted / max(drafted, 1), tokens / max(rounds, 1), exact)


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
        print(f"speedup: {harness.SPEEDUP_DEFINITION}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump([asdict(r) for r in results], f, indent=2)
        return 0 if all(r.exact for r in results) else 1

    p.set_defaults(func=main)
