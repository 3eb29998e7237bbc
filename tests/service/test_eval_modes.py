"""`specdec eval` end to end on the tiny models: every mode through the real services
(raw-text prompts), scored with the tiny target; the two greedy contrastive forms give
the same ids."""

from __future__ import annotations

import pytest

from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.setup import build_service
from specdec.runtime.models import build_tiny
from specdec_tools.bench import quality_eval, quality_report, quality_score

KEYS = quality_eval.MODE_KEYS
PROMPTS = ["Large language models are", "When I opened the door, I saw"]


@pytest.fixture(scope="module")
def service(draft_server, target_server):
    return build_service(CoordinatorConfig(draft=draft_server[0], target=target_server[0],
                                           pipeline=False))


def test_every_mode_runs_and_is_scored(service):
    chosen = quality_eval.modes(k=3, keys=KEYS)
    samples = quality_eval.run_modes(service, chosen, PROMPTS, [1, 2], 12, warmup_tokens=2,
                                     say=lambda _m: None)
    assert len(samples) == len(chosen) * len(PROMPTS) * 2
    assert all(1 <= s.tokens <= 12 for s in samples)  # EOS (id 2) may end a text
    ids = {p: quality_eval.prompt_ids(service, p) for p in PROMPTS}
    scorer = build_tiny("tiny-random").model
    loglik = quality_score.cached(
        lambda p, tokens: quality_score.mean_loglik(scorer, ids[p], tokens))
    rows, comps = quality_score.summarise(samples, chosen, loglik)
    assert [r.mode for r in rows] == list(KEYS)
    for r in rows:
        assert r.loglik is not None and r.loglik < 0 and r.tokens_per_s > 0
        assert (r.mean_head_size is not None and r.mean_head_size >= 1) == \
            (r.decoding == quality_eval.CONTRASTIVE)
        assert r.deterministic in ((True,) if r.temperature == 0 else (None,))
    by = {(c.scenario, c.baseline): c for c in comps}
    assert by[("cd-greedy-spec", "cd-greedy")].identical is True
    assert by[("cd-greedy-spec", "cd-greedy")].pairs == 4
    md = quality_report.markdown(rows, comps, {}, samples)
    assert "contrastive greedy, speculative K=3" in md and "identical ids on 4" in md
