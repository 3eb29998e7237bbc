"""Every loop variant's output on the shipped bench prompts, to compare two versions of the
code: a refactoring must not change one token.

    python -m specdec_tools.outputs run OUT.json    # with the version to record on sys.path
    python -m specdec_tools.outputs compare A.json B.json

`run` starts the real SmolLM2 services (the contrastive pair, whose draft can also be the
amateur) and an in-process coordinator per variant, and generates each prompt with each
variant. Greedy variants must equal target-only whatever the timing; the sampled ones
here set K (a request that sets K has drafts that do not depend on timings), so two runs
of the same code give the same ids, and so must two versions that decode alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack

MAX_NEW_TOKENS = 48
# (name, CoordinatorConfig fields, the request's K or None, temperature, decoding)
VARIANTS = [
    ("target-only greedy", {}, 0, 0.0, 0),
    ("sequential K=4 greedy", {"pipeline": False}, 4, 0.0, 0),
    ("pipelined K=4 greedy", {}, 4, 0.0, 0),
    ("load-aware (server K) greedy", {}, None, 0.0, 0),
    ("lookup greedy", {"drafter": "lookup"}, None, 0.0, 0),
    ("hybrid greedy", {"drafter": "hybrid"}, 4, 0.0, 0),
    ("model drafter greedy", {"drafter": "model"}, 4, 0.0, 0),
    ("confidence exit greedy", {"confidence_exit": True}, 4, 0.0, 0),
    ("sequential K=4 sampled T=0.7", {"pipeline": False, "load_aware_k": False}, 4, 0.7, 0),
    ("pipelined K=4 sampled T=0.7", {"load_aware_k": False, "drafter": "model"}, 4, 0.7, 0),
    ("target-only sampled T=0.7", {}, 0, 0.7, 0),
    ("contrastive greedy K=0", {}, 0, 0.0, 1),
    ("contrastive greedy K=3", {}, 3, 0.0, 1),
]


def run(out_path: str, seed: int = 7) -> dict:
    from tqdm import tqdm

    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import pair as pairs
    from specdec.v1 import common_pb2, generate_pb2
    from specdec_tools.bench.prompts import PROMPTS

    out: dict[str, dict[str, list[int]]] = {}
    with ExitStack() as stack:
        running = pairs.start(pairs.CONTRASTIVE_PAIR, stack)
        bar = tqdm(total=len(VARIANTS) * len(PROMPTS), desc="outputs", unit="generation")
        for name, fields, k, temperature, decoding in VARIANTS:
            service = build_service(CoordinatorConfig(
                draft=running.draft.address, target=running.target.address, **fields))
            out[name] = {}
            for prompt, text in PROMPTS:
                req = generate_pb2.GenerateRequest(
                    messages=[generate_pb2.ChatMessage(role="user", content=text)],
                    max_new_tokens=MAX_NEW_TOKENS, decoding=decoding,
                    sampling=common_pb2.SamplingParams(temperature=temperature, seed=seed))
                if k is not None:
                    req.num_draft_tokens = k
                out[name][prompt] = list(service.generate(req).token_ids)
                bar.update()
        bar.close()
    with open(out_path, "w") as f:
        json.dump(out, f, indent=0)
    return out


def compare(a: dict, b: dict) -> list[str]:
    """One line per variant; a variant that differs, or a greedy one that is not
    target-only's output, says so (the caller exits 1 on any)."""
    lines, bad = [], False
    reference = a.get("target-only greedy")
    for name in sorted(set(a) | set(b), key=lambda n: list(a).index(n) if n in a else 99):
        same = a.get(name) == b.get(name)
        greedy = "greedy" in name and "contrastive" not in name
        exact = not greedy or (a.get(name) == reference and b.get(name) == reference)
        bad |= not (same and exact)
        tokens = sum(len(ids) for ids in (a.get(name) or {}).values())
        lines.append(f"{name:32s} {'same' if same else 'DIFFERENT'}"
                     f"{'' if exact else ', NOT target-only'} ({tokens} tokens)")
    return lines + (["FAIL"] if bad else ["all the same"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec_tools.outputs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="record every variant's output ids as JSON")
    r.add_argument("out", help="the JSON file to write")
    r.add_argument("--seed", type=int, default=7, help="the sampled variants' seed "
                   "(default: %(default)s)")
    c = sub.add_parser("compare", help="compare two recordings; exit 1 on any difference")
    c.add_argument("a", help="a JSON file of `run`")
    c.add_argument("b", help="another")
    args = p.parse_args(argv)
    if args.what == "run":
        run(args.out, args.seed)
        return 0
    with open(args.a) as fa, open(args.b) as fb:
        lines = compare(json.load(fa), json.load(fb))
    print("\n".join(lines))
    return 1 if lines[-1] == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
