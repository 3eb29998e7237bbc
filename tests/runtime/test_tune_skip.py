"""`specdec tune-skip` for real on a small model: a study that writes a set the draft can
load, resumes where it stopped (after Ctrl-C too), compares with random sets, and
whose predictions `specdec bench-skip` can recompute; and teacher-forced agreement that
counts what greedy rounds would accept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from specdec.runtime.layer_skip import parse
from specdec.runtime.models import build_tiny, tiny_config

LAYERS = 6
ARGS = ["--draft", "torch-fp32", "--prompts", "2", "--max-new-tokens", "12", "--k", "1-3",
        "--random", "2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A 6-layer tiny llama as a Hugging Face folder, with the tiny tokenizer."""
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny6")
    config = tiny_config()
    config.num_hidden_layers = LAYERS
    torch.manual_seed(5)
    LlamaForCausalLM(config).eval().save_pretrained(str(out))
    build_tiny("tiny-random").tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


def tune(folder, home, *extra, wait=True):
    cmd = [sys.executable, "-m", "specdec.cli", "tune-skip", "--model", str(folder), *ARGS,
           *extra]
    env = {**os.environ, "SPECDEC_HOME": str(home)}
    if not wait:
        # SIGINT as a terminal would deliver it: a suite started in the background by a
        # non-interactive shell (nohup make test &) has it ignored, and children inherit
        # that, so the Ctrl-C test would wait for 100000 trials.
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_a_study_writes_a_set_the_draft_can_load_and_resumes(folder, home, tmp_path):
    out, js = tmp_path / "best.skip", tmp_path / "result.json"
    r = tune(folder, home, "--trials", "6", "--out", str(out), "--json", str(js))
    assert r.returncode == 0, r.stderr[-3000:]
    best = parse(f"@{out}")
    assert 1 <= len(best) <= LAYERS - 1 and max(best) < LAYERS
    result = json.loads(js.read_text())
    assert result["finished"] == 6 and (home / "tune" / "studies.db").exists()
    assert parse(result["best"]["skip"]) == best
    assert len(result["random"]) == 2
    assert all(len(parse(x["skip"])) == len(best) and parse(x["skip"]) != best
               for x in result["random"])
    assert 0.0 <= result["break_even_acceptance"] <= 1.0
    assert f"best set: {result['best']['skip']}" in r.stdout
    # The ranked order for skipping on the fly starts with the best set's layers.
    from specdec.runtime.layer_skip import parse_order

    order = parse_order(f"@{out.with_suffix('.order')}")
    assert sorted(order) == list(range(LAYERS))
    assert tuple(sorted(order[:len(best)])) == best

    # The same command with more trials resumes the stored study.
    r2 = tune(folder, home, "--trials", "9", "--out", str(out), "--json", str(js))
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "6 of 9 trials done, resuming" in r2.stderr
    assert json.loads(js.read_text())["finished"] == 9

    # bench-skip's predictions come from the same study and cost model.
    from specdec_tools.skip_tune.predict import predictor

    b = json.loads(js.read_text())["best"]
    kind, predict = predictor(str(js), b["prediction"]["k"])
    assert kind == "torch-fp32"
    assert predict(parse(b["skip"])) == pytest.approx(b["prediction"]["speedup"])


def _finished(home, name_prefix) -> int:
    """Finished trials of the study named `name_prefix`..., read straight from the SQLite
    file, read-only: opening it through optuna while the tuner creates it would run
    optuna's schema set-up from two processes at once (the tuner then failed once with
    UNIQUE constraint failed: alembic_version)."""
    import sqlite3

    from specdec_tools.skip_tune.study import DONE_STATES

    path = home / "tune" / "studies.db"
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            rows = db.execute(
                "SELECT t.state FROM trials t JOIN studies s ON s.study_id = t.study_id "
                "WHERE s.study_name LIKE ?", (name_prefix + "%",)).fetchall()
    except sqlite3.OperationalError:  # the tables are not there yet, or locked a moment
        return 0
    return sum(state in DONE_STATES for (state,) in rows)


@pytest.mark.long
def test_ctrl_c_keeps_the_finished_trials_and_a_rerun_resumes(folder, tmp_path):
    home = tmp_path / "home"
    proc = tune(folder, home, "--trials", "100000", "--out", str(tmp_path / "s"), wait=False)
    deadline = time.monotonic() + 300
    while _finished(home, folder.name) < 3:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no trial finished in 5 minutes"
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err and "run the same command again to resume" in err
    done = _finished(home, folder.name)
    assert done >= 3
    r = tune(folder, home, "--trials", str(done + 2), "--out", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{done} of {done + 2} trials done, resuming" in r.stderr
    assert _finished(home, folder.name) == done + 2


def test_teacher_forced_agreement_of_the_full_model_with_its_own_text_is_total(folder):
    """Positions line up: the model predicts each token of its own greedy text; a model
    missing layers does not."""
    from specdec.runtime.models import load
    from specdec.runtime.torch_backend import TorchBackend
    from specdec_tools.skip_tune import agreement, calibration

    loaded = load(str(folder))
    calib = calibration.build(TorchBackend(loaded), loaded.tokenizer, ["hello there"], 20)
    seq = calib.sequences[0]
    assert len(seq.generated) == 20
    assert agreement.flags(loaded.model, seq) == [True] * 20
    assert not all(agreement.flags(loaded.model, seq, (1, 2, 3, 4)))
    assert len(loaded.model.model.layers) == LAYERS  # whole again


def test_bad_bounds_get_a_clear_error(folder, home):
    r = tune(folder, home, "--trials", "1", "--min-skip", "4", "--max-skip", "2")
    assert r.returncode == 2 and "need 0 <= min <= max <= 5" in r.stderr
