"""`specdec bench-skip`: layer-skip drafts through the real services, side by side.

For each draft (today's int8 draft, the set `specdec tune-skip` chose, random sets of
the same size, and any --set), the target and that draft are started as processes
(pinned as specdec.pair.placement says) and the same chat prompts are generated
greedily target-only (K=0), with sequential rounds and with pipelined rounds, through
the coordinator's GenerationService in this process, interleaved per prompt. Reports
acceptance, draft ms per drafted token (Propose time over drafted tokens), median
tokens/s, the speedup of each loop (harness.SPEEDUP_DEFINITION), the cost model's
prediction next to the measured sequential speedup, and whether every speculative
text equals its target-only twin.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from specdec.runtime import layer_skip
from specdec_tools.bench import harness

PROMPTS_DEFAULT = 4  # of specdec_tools.bench.prompts.PROMPTS


@dataclass
class Row:
    draft: str
    skip: str
    k: int
    target_only_tokens_per_s: float
    sequential_tokens_per_s: float
    pipelined_tokens_per_s: float
    sequential_speedup: float  # harness.SPEEDUP_DEFINITION
    pipelined_speedup: float
    acceptance: float  # accepted / drafted, sequential rounds
    draft_ms_per_token: float  # Propose time / drafted tokens, sequential rounds
    predicted_speedup: float | None  # the cost model's, sequential, at this K
    exact: bool


def _stats(samples, name: str) -> tuple[float, float]:
    mine = [s for s in samples if s.scenario == name]
    drafted = sum(s.drafted for s in mine)
    return (sum(s.accepted for s in mine) / max(drafted, 1),
            1000 * sum(sum(s.propose_s) for s in mine) / max(drafted, 1))


def pair_for(label: str, skip: layer_skip.SkipSet, model: str, weights: str = "int8",
             torch_pair: bool = False, on_the_fly: layer_skip.SkipSet = ()):
    """The default pair with its draft as asked: OpenVINO at `weights` minus `skip`; or a
    torch pair (fp32 target, the same weights as its draft), whose draft chooses its set
    on the fly from the order `on_the_fly` when one is given."""
    from specdec import pair as pairs

    base = pairs.DEFAULT_PAIR.with_models(model, model)
    if torch_pair:
        flags = ("--skip-on-the-fly", ",".join(map(str, on_the_fly))) if on_the_fly else ()
        return pairs.Pair(label, base.target.with_(backend="torch", weights=None),
                          base.draft.with_(backend="torch", weights=None, extra=flags))
    draft = base.draft.with_(weights=weights)
    if skip:
        draft = draft.with_(extra=draft.extra + ("--skip-layers", layer_skip.format_set(skip)))
    return pairs.Pair(label, base.target, draft)


def measure(label: str, skip: layer_skip.SkipSet, pair, k: int, messages: list[str],
            max_new_tokens: int, repeats: int, predicted=None) -> Row:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import pair as pairs
    from specdec_tools.bench.system import BASELINE, SystemScenario

    with ExitStack() as stack:
        running = pairs.start(pair, stack)

        def service(pipeline: bool):
            return build_service(CoordinatorConfig(target=running.target.address,
                                                   draft=running.draft.address,
                                                   pipeline=pipeline, drafter="model"))

        seq, pip = SystemScenario(service(False), k), SystemScenario(service(True), k,
                                                                     "pipelined")
        base = SystemScenario(service(False), 0)
        samples = harness.run_side_by_side([base, seq, pip], messages, max_new_tokens,
                                           repeats, warmup=True, desc=label)
    by = {sc.name: [s for s in samples if s.scenario == sc.name] for sc in (base, seq, pip)}
    exact = all(s.token_ids == b.token_ids for name in (seq.name, pip.name)
                for s, b in zip(by[name], by[BASELINE], strict=True))
    acceptance, draft_ms = _stats(samples, seq.name)
    return Row(label, layer_skip.format_set(skip), k,
               harness.median_tps(samples, BASELINE), harness.median_tps(samples, seq.name),
               harness.median_tps(samples, pip.name),
               harness.speedup(samples, seq.name, BASELINE) or 0.0,
               harness.speedup(samples, pip.name, BASELINE) or 0.0,
               acceptance, draft_ms, predicted, exact)


def table(rows: list[Row]) -> str:
    lines = ["| draft | skipped layers | K | acceptance | draft ms/token | predicted "
             "(cost model) | sequential speedup | pipelined speedup | tok/s target-only / "
             "seq / pipelined | exact |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pred = f"{r.predicted_speedup:.2f}x" if r.predicted_speedup is not None else "-"
        lines.append(
            f"| {r.draft} | {r.skip or 'none'} | {r.k} | {r.acceptance:.2f} | "
            f"{r.draft_ms_per_token:.1f} | {pred} | {r.sequential_speedup:.2f}x | "
            f"{r.pipelined_speedup:.2f}x | {r.target_only_tokens_per_s:.1f} / "
            f"{r.sequential_tokens_per_s:.1f} / {r.pipelined_tokens_per_s:.1f} | "
            f"{'yes' if r.exact else 'NO'} |")
    return "\n".join(lines)


def drafts(tuned: layer_skip.SkipSet | None, extra: list[layer_skip.SkipSet], randoms: int,
           seed: int, layers: int, weights: str = "int8") -> list[tuple[str, layer_skip.SkipSet]]:
    """(label, set) per row: the whole draft, the tuned set, random sets of its size,
    then the extra sets."""
    out = [(f"{weights} draft" + (" (default)" if weights == "int8" else ""), ())]
    if tuned:
        out.append((f"{weights} tuned (specdec tune-skip)", tuned))
        out += [(f"{weights} random {len(tuned)}", s)
                for s in layer_skip.random_sets(layers, len(tuned), randoms, seed, tuned)]
    out += [(f"{weights} given", s) for s in extra]
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("bench-skip", help="layer-skip drafts through the services, side by "
                       "side", description=__doc__.split("\n\n")[0] + " Exports each set's "
                       "int8 IR first if needed (specdec prepare --skip-layers).")
    p.add_argument("--tuned", type=layer_skip.arg, metavar="SET",
                   help="the tuned set, usually @FILE from specdec tune-skip")
    p.add_argument("--tune-json", metavar="FILE", action="append", default=[],
                   help="specdec tune-skip --json output: its predictions fill the "
                        "'predicted' column of the rows whose draft it was tuned for "
                        "(at the bench's --k); repeatable, one per --draft of tune-skip")
    p.add_argument("--random", type=int, default=2,
                   help="random sets of the tuned set's size (default: %(default)s)")
    p.add_argument("--set", dest="sets", action="append", type=layer_skip.arg, default=[],
                   metavar="SET", help="a further set to measure (repeatable)")
    p.add_argument("--fp32", type=layer_skip.arg, metavar="SET",
                   help="also the OpenVINO draft with the target's own fp32 weights (Draft "
                        "& Verify's setting), whole and minus SET (@FILE: tune-skip --draft "
                        "ov-fp32)")
    p.add_argument("--on-the-fly", type=layer_skip.order_arg, metavar="ORDER",
                   help="also a torch pair whose draft (the target's fp32 weights) skips "
                        "on the fly from this ranked order (@FILE: tune-skip's .order), and "
                        "the same pair with the whole model as its draft; their speedups "
                        "are over that pair's own target-only")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round (default: 4)")
    p.add_argument("--prompts", type=int, default=PROMPTS_DEFAULT,
                   help="the first N shipped benchmark prompts (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens per generation (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="passes over the prompts (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random sets (default: 0)")
    p.add_argument("--model", default="smollm2-135m", help="model (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.set_defaults(func=main)


def main(args) -> int:
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export
    from specdec_tools.bench.prompts import PROMPTS
    from specdec_tools.skip_tune.predict import predictor

    folder = prepare_smollm2()
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    wanted = [(label, skip, pair_for(label, skip, args.model))
              for label, skip in drafts(args.tuned, args.sets, args.random, args.seed,
                                        layers)]
    if args.fp32 is not None:
        for label, skip in drafts(args.fp32, [], 0, args.seed, layers, "fp32"):
            wanted.append((label, skip, pair_for(label, skip, args.model, "fp32")))
    if args.on_the_fly:
        wanted.append(("torch pair, whole model as draft", (),
                       pair_for("torch whole", (), args.model, torch_pair=True)))
        wanted.append(("torch pair, skipping on the fly", (),
                       pair_for("torch on the fly", (), args.model, torch_pair=True,
                                on_the_fly=args.on_the_fly)))
    predictors = {}
    for path in args.tune_json:
        kind, fn = predictor(path, args.k)
        predictors[kind] = fn
    messages = [m for _, m in PROMPTS[:args.prompts]]
    rows, failed = [], []
    for label, skip, pair in tqdm(wanted, desc="drafts", unit="draft"):
        kind = f"{'ov' if pair.draft.backend == 'openvino' else 'torch'}-" \
               f"{pair.draft.weights or 'fp32'}"
        predict = predictors.get(kind) if pair.target.backend == "openvino" else None
        try:
            if skip:
                export(folder, pair.draft.weights, skip_layers=skip)
            rows.append(measure(label, skip, pair, args.k, messages, args.max_new_tokens,
                                args.repeats, predict(skip) if predict else None))
        except (RuntimeError, OSError, ValueError) as e:  # a draft that does not start
            failed.append(f"{label} ({layer_skip.format_set(skip) or 'none'}): {e}")
            tqdm.write(f"failed: {failed[-1]}")
            continue
        tqdm.write(table(rows[-1:]).splitlines()[-1])
        if args.json:  # after every row: a long run that stops keeps what it measured
            Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    print(table(rows))
    print(f"speedup: {harness.SPEEDUP_DEFINITION}")
    for f in failed:
        print(f"failed: {f}")
    if failed:
        return 1
    return 0 if all(r.exact for r in rows) else 1
