"""The cost model's prediction for any skip set, from a finished `specdec tune-skip`
study: its calibration text and measured step costs, so that `specdec bench-skip` can
print the prediction next to the measured speedup of every set it runs."""

from __future__ import annotations

import json
from collections.abc import Callable

from specdec.runtime.layer_skip import SkipSet


def predictor(tune_json: str, k: int) -> tuple[str, Callable[[SkipSet], float]]:
    """(the draft the study tuned for, e.g. "ov-int8"; skip set -> predicted sequential
    speedup at `k`), for the study `tune_json` names (the --json file of specdec
    tune-skip)."""
    from specdec.runtime import models
    from specdec_tools.skip_tune import drafts
    from specdec_tools.skip_tune.calibration import Calibration
    from specdec_tools.skip_tune.evaluator import Evaluator
    from specdec_tools.skip_tune.study import open_study

    result = json.loads(open(tune_json).read())
    study = open_study(result["study"], result["db"], seed=0)
    settings = study.user_attrs["settings"]
    target = models.load(settings["model"])
    setup = drafts.Setup(drafts.scored_model(settings["draft"], target), None, None,
                         target.vocab_size)
    ev = Evaluator(setup, target, Calibration.from_json(study.user_attrs["calibration"]),
                   dict(study.user_attrs["measured"]), (k,), settings["threads"],
                   settings["rpc_ms"])
    return settings["draft"], lambda skip: ev.predict(tuple(skip)).speedup
