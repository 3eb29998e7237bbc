"""lm-evaluation-harness against our HTTP API, on the repo's local tasks
(tests/lm_eval_tasks: multiple choice by log-likelihood, and generate_until): the same
scores and per-item results with speculation on and off, and the scores of lm-eval's own
in-process transformers model (`hf`) on the same weights, nothing from the hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.runtime.models import build_tiny

pytestmark = [pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["specdec_mc", "specdec_gen"]


def _evaluate(model: str, model_args: dict, gen_kwargs: str | None = None) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(model=model, model_args=model_args, tasks=TASKS,
                           task_manager=TaskManager(include_path=str(ROOT / "tests" /
                                                                      "lm_eval_tasks")),
                           gen_kwargs=gen_kwargs, log_samples=True, batch_size=1,
                           random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                           fewshot_random_seed=0)


def _per_item(results: dict, task: str) -> list:
    """Each item's result: log-likelihoods per choice, or the generated text."""
    return [s["filtered_resps"] for s in sorted(results["samples"][task],
                                                 key=lambda s: s["doc_id"])]


def test_scores_equal_with_speculation_on_and_off_and_the_reference(coordinator, tmp_path,
                                                                    monkeypatch):
    monkeypatch.chdir(ROOT)  # the tasks name their data relative to the repo root
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = tmp_path / "tiny-random"  # the served weights, for lm-eval's tokenizer and hf
    loaded = build_tiny("tiny-random")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    api = dict(model="tiny-random", base_url=coordinator[3] + "/v1/completions",
               tokenizer_backend="huggingface", tokenizer=str(folder), num_concurrent=1,
               max_retries=1)
    on = _evaluate("local-completions", api, "num_draft_tokens=4")
    off = _evaluate("local-completions", api, "num_draft_tokens=0")
    ref = _evaluate("hf", dict(pretrained=str(folder), dtype="float32", device="cpu"))
    for task in TASKS:
        assert on["results"][task] == off["results"][task], task
        for a, b in zip(_per_item(on, task), _per_item(off, task), strict=True):
            assert a == b, task
    for metric in ("acc,none", "acc_norm,none"):
        assert on["results"]["specdec_mc"][metric] == ref["results"]["specdec_mc"][metric]
    assert on["results"]["specdec_gen"]["exact_match,strip"] == \
        ref["results"]["specdec_gen"]["exact_match,strip"]
    for ours, theirs in zip(_per_item(on, "specdec_mc"), _per_item(ref, "specdec_mc"),
                            strict=True):  # [(log-likelihood, is_greedy)] per choice
        for (ll, greedy), (ref_ll, ref_greedy) in zip(ours, theirs, strict=True):
            assert abs(ll - ref_ll) < 5e-3 * max(1.0, abs(ref_ll) / 10) and \
                greedy == ref_greedy
    assert _per_item(on, "specdec_gen") == _per_item(ref, "specdec_gen")
