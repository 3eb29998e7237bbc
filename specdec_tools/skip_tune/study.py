"""The optuna study over skip sets (Draft & Verify's Bayesian optimisation, with TPE).

One trial is one skip set, sampled by multivariate TPE (Bergstra et al. 2011; optuna's
TPESampler) as a count of layers to skip in [min_skip, max_skip] (on a log scale:
agreement falls fast with the count) and a score per layer;
the set is the `count` lowest-scored layers. (A True/False choice per layer, as the
seed had, starts TPE at sets of half the layers, far from where the optimum lies at
this size; with a count, TPE learns the size and the order separately.) Its value is
the predicted speedup of the cost model (specdec_tools.skip_tune.cost) over the calibration
sequences, reported after each sequence so that the median pruner stops hopeless sets
early.

The study lives in SQLite (optuna's RDB storage) with its calibration text and measured
step costs as study attributes, so a rerun of the same command resumes it with the same
inputs. `compare_random` then scores random sets of the best set's size, as the seed
did.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import asdict, dataclass

from specdec.runtime.layer_skip import SkipSet, format_set, random_sets
from specdec_tools.skip_tune.cost import Prediction, break_even_acceptance
from specdec_tools.skip_tune.evaluator import Evaluator

DONE_STATES = ("COMPLETE", "PRUNED")
SPACE = 4  # version of the search space and cost model: a study of another is not resumed


def storage_url(path) -> str:
    return f"sqlite:///{path}"


def open_study(name: str, path, seed: int):
    """Create or load the study `name` in the SQLite file `path`."""
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(storage_url(path))
    try:
        done = len(optuna.load_study(study_name=name, storage=storage).trials)
    except KeyError:
        done = 0
    # a resumed study gets a fresh seed, or TPE's start-up samples would repeat
    sampler = optuna.samplers.TPESampler(seed=seed + done, multivariate=True,
                                         n_startup_trials=10)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=8, n_warmup_steps=1)
    return optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                               direction="maximize", sampler=sampler, pruner=pruner)


def finished(study) -> int:
    return sum(t.state.name in DONE_STATES for t in study.trials)


def suggest_set(trial, num_layers: int, min_skip: int, max_skip: int) -> SkipSet:
    count = trial.suggest_int("skipped", min_skip, max_skip, log=min_skip >= 1)
    scores = [trial.suggest_float(f"keep_{i}", 0.0, 1.0) for i in range(num_layers)]
    return tuple(sorted(sorted(range(num_layers), key=lambda i: scores[i])[:count]))


def record(trial, p: Prediction) -> None:
    for key, value in asdict(p).items():
        trial.set_user_attr(key, value)


def objective(ev: Evaluator, min_skip: int, max_skip: int):
    import optuna

    def run(trial) -> float:
        skip = suggest_set(trial, ev.num_layers, min_skip, max_skip)
        trial.set_user_attr("skip", format_set(skip))
        n = len(ev.calibration.sequences)
        for seen in range(1, n + 1):
            p = ev.predict(skip, seen)
            trial.report(p.speedup, seen - 1)
            if seen < n and trial.should_prune():
                record(trial, p)
                raise optuna.TrialPruned()
        record(trial, p)
        return p.speedup

    return run


@dataclass
class Scored:
    skip: str
    skipped: int
    prediction: Prediction


def best_trial(study) -> Scored | None:
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    if not complete:
        return None
    t = max(complete, key=lambda t: t.value)
    a = t.user_attrs
    skip = a["skip"]
    return Scored(skip, len(skip.split(",")) if skip else 0,
                  Prediction(a["k"], a["speedup"], a["tokens_per_round"], a["acceptance"],
                             a["c"]))


def compare_random(ev: Evaluator, size: int, count: int, seed: int, exclude: SkipSet = (),
                   progress=None) -> list[Scored]:
    """`count` distinct random sets of `size` layers (never `exclude`), fully scored."""
    out = []
    for skip in random_sets(ev.num_layers, size, count, seed, exclude):
        out.append(Scored(format_set(skip), size, ev.predict(skip)))
        if progress is not None:
            progress.update(1)
    return out


def skip_order(ev: Evaluator, best: SkipSet, progress=None) -> tuple[int, ...]:
    """Every layer, the first to skip first, for a draft that skips on the fly: the best
    set's layers, then the others by the predicted speedup of skipping each alone (a
    one-layer ablation, one pass per layer and sequence)."""
    alone = {}
    for i in range(ev.num_layers):
        if i not in best:
            alone[i] = ev.predict((i,)).speedup
        if progress is not None:
            progress.update(1)
    return tuple(best) + tuple(sorted(alone, key=lambda i: -alone[i]))


def summary(best: Scored, baseline: Prediction, randoms: list[Scored], ev: Evaluator) -> dict:
    """What the command prints and writes: the best set, today's full draft at the same
    precision (no layer skipped), the random sets, and the break-even acceptance."""
    speeds = [r.prediction.speedup for r in randoms]
    p = best.prediction
    return {
        "best": asdict(best),
        "no_skip": asdict(baseline),
        "random": [asdict(r) for r in randoms],
        "random_median_speedup": statistics.median(speeds) if speeds else None,
        "random_max_speedup": max(speeds) if speeds else None,
        "break_even_acceptance": break_even_acceptance(
            p.c, p.k, ev.verify_ms(p.k + 1) / ev.verify_ms(1)),
        "break_even_by_skipped": break_even_table(ev),
        "measured_ms": ev.measured,
    }


def break_even_table(ev: Evaluator, counts=(0, 1, 2, 4, 6, 8, 12, 16)) -> list[dict]:
    """Per count of skipped layers: the draft's cost c over a target step, and the lowest
    i.i.d. acceptance at which any K of the study breaks even (Leviathan et al.)."""
    rows = []
    for n in (c for c in counts if c < ev.num_layers):
        costs = ev.costs(tuple(range(n)))
        c = costs.draft_ms / ev.verify_ms(1)
        k, a = min(((k, break_even_acceptance(c, k, ev.verify_ms(k + 1) / ev.verify_ms(1)))
                    for k in ev.ks), key=lambda ka: ka[1])
        rows.append({"skipped": n, "c": c, "k": k, "break_even_acceptance": a})
    return rows
