"""`specdec tune-skip`: choose a layer-skip draft's skip set with a Bayesian search."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import signal
import sys
import time
from pathlib import Path

from specdec import paths
from specdec_tools.skip_tune.drafts import DRAFTS

log = logging.getLogger("specdec.tune_skip")

DESCRIPTION = """\
Search which decoder layers a self-speculative draft (python -m draft_service
--skip-layers SET) should skip, with optuna's TPE (Draft & Verify's Bayesian
optimisation). Each trial scores one skip set with a cost model of the greedy
speculative loop: teacher-forced agreement of the model minus the set with the target's
own greedy text on the calibration prompts, replayed as rounds, and measured step
costs (a draft step per kept-layer count, a target pass per verify length, on --threads
threads). The value is the predicted speedup over target-only (speculative tok/s over
target-only tok/s). Hopeless sets are pruned after the first sequences. The study is
kept in SQLite under $SPECDEC_HOME/tune and resumes when the same command runs again
(Ctrl-C is safe). At the end, random sets of the best set's size are scored the same
way, and the best set is written to a file for --skip-layers @FILE. `specdec
bench-skip` measures the chosen sets through the real services."""


def add_parser(sub) -> None:
    p = sub.add_parser("tune-skip", help="Bayesian search of a layer-skip draft's skip set",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=paths.SMOLLM2,
                   help="the target model: a prepared name or a Hugging Face folder "
                        "(default: %(default)s)")
    p.add_argument("--draft", choices=DRAFTS, default="ov-int8",
                   help="the draft the set is for, backend-weights: ov-int8 is today's "
                        "default draft (agreement from torch weights rounded as its export "
                        "rounds them, step time from its IR); torch-int8 is torch's dynamic "
                        "int8 (--quantize int8) (default: %(default)s)")
    p.add_argument("--trials", type=int, default=50,
                   help="trials the study should hold when done; a resumed study runs only "
                        "the rest (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=8,
                   help="calibration prompts, the first N shipped benchmark prompts "
                        "(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="target tokens generated per calibration prompt (default: "
                        "%(default)s)")
    p.add_argument("--min-skip", type=int, default=1,
                   help="fewest layers a set may skip (default: %(default)s)")
    p.add_argument("--max-skip", type=int, default=None,
                   help="most layers a set may skip (default: all but one)")
    p.add_argument("--k", default="1-8",
                   help="draft lengths K the cost model may choose from, e.g. 1-8 or 2,4 "
                        "(default: %(default)s)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for the timed passes, as each service runs "
                        "(default: %(default)s)")
    p.add_argument("--rpc-ms", type=float, default=1.0,
                   help="overhead of one RPC in the cost model, ms (default: %(default)s, "
                        "about what docs/benchmarks.md measures per round on loopback)")
    p.add_argument("--random", type=int, default=10,
                   help="random sets of the best set's size to compare with (default: "
                        "%(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default: 0)")
    p.add_argument("--out", metavar="FILE",
                   help="where to write the best set, for --skip-layers @FILE (default: "
                        "$SPECDEC_HOME/tune/<study>.skip)")
    p.add_argument("--json", metavar="FILE", help="also write the full result as JSON")
    p.add_argument("--fresh", action="store_true",
                   help="delete a stored study with these settings and start again")
    p.set_defaults(func=main)


def _ks(text: str) -> tuple[int, ...]:
    from specdec.runtime.layer_skip import parse

    ks = tuple(k for k in parse(text) if k >= 1)
    if not ks:
        raise ValueError(f"--k {text!r}: no K >= 1")
    return ks


def study_name(args, num_layers: int, max_skip: int) -> str:
    from specdec_tools.skip_tune.study import SPACE

    settings = {"model": str(args.model), "draft": args.draft,
                "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                "min_skip": args.min_skip, "max_skip": max_skip, "k": args.k,
                "threads": args.threads, "rpc_ms": args.rpc_ms, "layers": num_layers,
                "space": SPACE}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return f"{Path(str(args.model)).name}-{args.draft}-{digest}"




def _calibration(study, target, args):
    from tqdm import tqdm

    from specdec.runtime.torch_backend import TorchBackend
    from specdec_tools.bench.prompts import PROMPTS
    from specdec_tools.skip_tune import calibration

    if "calibration" in study.user_attrs:
        return calibration.Calibration.from_json(study.user_attrs["calibration"])
    messages = [m for _, m in PROMPTS[:args.prompts]]
    with tqdm(total=len(messages), desc="calibration (target greedy)", unit="prompt") as bar:
        calib = calibration.build(TorchBackend(target), target.tokenizer, messages,
                                  args.max_new_tokens, bar)
    study.set_user_attr("calibration", calib.to_json())
    return calib


def _write_set(path: Path, result: dict, name: str) -> None:
    b = result["best"]
    p = b["prediction"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"{b['skip']}\n"
        f"# specdec tune-skip, study {name}: skip {b['skipped']} layers; predicted "
        f"{p['speedup']:.2f}x at K={p['k']}, acceptance {p['acceptance']:.2f}, c {p['c']:.2f}\n"
        f"# random sets of that size: median {result['random_median_speedup'] or 0:.2f}x, "
        f"best {result['random_max_speedup'] or 0:.2f}x; no layer skipped "
        f"{result['no_skip']['speedup']:.2f}x\n")


def report(result: dict) -> str:
    b, n = result["best"], result["no_skip"]
    p = b["prediction"]
    lines = [
        f"best set: {b['skip']} ({b['skipped']} layers skipped)",
        f"  predicted speedup {p['speedup']:.2f}x at K={p['k']}: acceptance "
        f"{p['acceptance']:.2f}, {p['tokens_per_round']:.2f} tokens/round, c {p['c']:.2f}",
        f"  break-even acceptance at that K and c: {result['break_even_acceptance']:.2f}",
        f"random sets of {b['skipped']} layers ({len(result['random'])}): median "
        f"{result['random_median_speedup'] or 0:.2f}x, "
        f"best {result['random_max_speedup'] or 0:.2f}x",
        f"no layer skipped (the full draft at this precision): {n['speedup']:.2f}x at "
        f"K={n['k']}, acceptance {n['acceptance']:.2f}, c {n['c']:.2f}",
        "break-even by layers skipped: " + ", ".join(
            f"{r['skipped']}: c {r['c']:.2f}, a {r['break_even_acceptance']:.2f} (K={r['k']})"
            for r in result["break_even_by_skipped"]),
        "speedup: predicted speculative tok/s over target-only tok/s (cost model)",
    ]
    return "\n".join(lines)


def main(args) -> int:
    try:
        return _main(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the trials (during calibration or timing)
        print("\ninterrupted before any new trial; run the same command again to resume",
              file=sys.stderr)
        return 130


def _main(args) -> int:
    import optuna
    from tqdm import tqdm

    from specdec.runtime import models
    from specdec.runtime.layer_skip import parse
    from specdec_tools.skip_tune import drafts
    from specdec_tools.skip_tune import study as studies
    from specdec_tools.skip_tune.evaluator import Evaluator

    ks = _ks(args.k)
    t0 = time.monotonic()
    log.info("loading %s", args.model)
    target = models.load(args.model)
    setup = drafts.build(args.draft, target, args.model, args.threads)
    layers = int(target.model.config.num_hidden_layers)
    max_skip = layers - 1 if args.max_skip is None else args.max_skip
    if not 0 <= args.min_skip <= max_skip < layers:
        raise ValueError(f"--min-skip {args.min_skip} / --max-skip {max_skip}: need 0 <= "
                         f"min <= max <= {layers - 1} ({layers} decoder layers)")
    name = study_name(args, layers, max_skip)
    db = paths.default_home() / "tune" / "studies.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        try:
            optuna.delete_study(study_name=name, storage=studies.storage_url(db))
        except KeyError:
            pass
    study = studies.open_study(name, db, args.seed)
    done = studies.finished(study)
    log.info("study %s in %s: %d of %d trials done%s", name, db, done, args.trials,
             ", resuming" if done else "")
    study.set_user_attr("settings", {"model": str(args.model), "draft": args.draft,
                                     "threads": args.threads, "rpc_ms": args.rpc_ms})
    calib = _calibration(study, target, args)
    measured = dict(study.user_attrs.get("measured", {}))
    ev = Evaluator(setup, target, calib, measured, ks, args.threads, args.rpc_ms)
    for n in sorted({1, *(k + 1 for k in ks)}):
        ev.verify_ms(n)
    study.set_user_attr("measured", ev.measured)

    # Ctrl-C during the trials stops the study after the trial in flight: a
    # KeyboardInterrupt raised inside optuna's storage writes can escape as another error.
    interrupted = []

    def save(study_, _trial) -> None:
        study_.set_user_attr("measured", ev.measured)
        if interrupted:
            study_.stop()

    remaining = max(args.trials - done, 0)
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        if remaining:
            study.optimize(studies.objective(ev, args.min_skip, max_skip),
                           n_trials=remaining, show_progress_bar=True, callbacks=[save])
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        study.set_user_attr("measured", ev.measured)
        print(f"\ninterrupted: {studies.finished(study)} of {args.trials} trials are stored "
              f"in {db}; run the same command again to resume", file=sys.stderr)
        return 130
    best = studies.best_trial(study)
    if best is None:
        print("error: no trial completed (every set was pruned); widen --min-skip/"
              "--max-skip or run more --trials", file=sys.stderr)
        return 1
    with tqdm(total=args.random, desc=f"random sets of {best.skipped}", unit="set") as bar:
        randoms = studies.compare_random(ev, best.skipped, args.random, args.seed,
                                         exclude=parse(best.skip),
                                         progress=bar)
    result = studies.summary(best, ev.predict(()), randoms, ev)
    result.update(study=name, db=str(db), trials=len(study.trials),
                  finished=studies.finished(study),
                  pruned=sum(t.state.name == "PRUNED" for t in study.trials))
    out = Path(args.out) if args.out else db.parent / f"{name}.skip"
    _write_set(out, result, name)
    with tqdm(total=layers, desc="one-layer ablation (skip order)", unit="layer") as bar:
        ranked = studies.skip_order(ev, parse(best.skip), bar)
    result["order"] = ",".join(map(str, ranked))
    result["seconds"] = round(time.monotonic() - t0, 1)
    order = out.with_suffix(".order")
    order.write_text(f"{result['order']}\n# specdec tune-skip, study {name}: every layer, "
                     "the first to skip first: the best set, then the rest by the predicted "
                     "speedup of skipping each alone\n")
    print(report(result))
    print(f"wrote {out}: python -m draft_service --skip-layers @{out} ...")
    print(f"wrote {order}: python -m draft_service --backend torch --skip-on-the-fly "
          f"@{order} ...")
    print(f"{result['seconds']:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
