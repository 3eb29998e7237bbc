"""Sampled contrastive output over the real services follows the contrastive distribution
softmax(score / T) on V_head, computed in this process from the two models' logits
(a chi-square test of the two-token joint law, as for speculative sampling), in the
plain form and the speculative form, where accept/resample runs against it."""

from __future__ import annotations

from collections import Counter

import pytest

from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.contrastive import LI, OBRIEN, contrastive_distribution
from specdec.runtime.models import TINY_DRAFT, TINY_TARGET, build_tiny
from specdec.sampling import SamplingParams
from specdec_tools.contrastive_reference import last_logits
from tests.service._contrastive_helpers import params
from tests.service.test_sampled_distribution import chi_square_p_value, run_seeds

PROMPT = [31, 415, 92, 65]
TRIALS = 1200


def contrastive_joint(p, temperature: float, n: int = 2) -> dict[tuple[int, ...], float]:
    """Exact P(t1..tn) under the contrastive distribution of the tiny pair."""
    expert, amateur = build_tiny(TINY_TARGET).model, build_tiny(TINY_DRAFT).model
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        longer = {}
        for prefix, prob in joint.items():
            ids = PROMPT + list(prefix)
            dist = contrastive_distribution(last_logits(expert, ids), last_logits(amateur, ids),
                                            p, temperature)
            for t in dist.nonzero().flatten().tolist():
                longer[prefix + (t,)] = prob * float(dist[t])
        joint = longer
    return joint


@pytest.mark.slow
@pytest.mark.parametrize(
    ("p", "temperature", "k", "top_n"),
    [
        pytest.param(params(OBRIEN), 1.0, 0, 0, marks=pytest.mark.long),  # no drafts
        # The speculative form: accept/resample against p_cd, residuals included. (With
        # the draft's q cut to 2 ids, top_n = 2, K = 3, it passed too: p = 0.62.)
        (params(LI, amateur_temperature=0.7), 0.8, 2, 0),
    ],
    ids=["obrien-plain", "li-Ta0.7-T0.8-K2"],
)
def test_two_token_joint_matches_the_contrastive_distribution(draft_client, target_client,
                                                              p, temperature, k, top_n):
    expected = contrastive_joint(p, temperature)
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False, top_n=top_n))
    results = run_seeds(lambda seed: loop.generate(
        PROMPT, 2, SamplingParams(temperature=temperature, seed=seed), num_draft_tokens=k,
        contrastive=p), TRIALS)
    counts = Counter(tuple(r.token_ids) for r in results)
    accepted = sum(r.stats.accepted_tokens for r in results)
    drafted = sum(r.stats.drafted_tokens for r in results)
    if k:
        assert 0 < accepted < drafted  # both accept and reject paths were exercised
    p_value = chi_square_p_value(counts, expected, TRIALS)
    print(f"chi-square p = {p_value:.3f}, acceptance = {accepted / max(drafted, 1):.2f}, "
          f"cells = {len(expected)}")
    assert p_value > 1e-3, (p_value, counts.most_common(8))


def test_the_target_distribution_fails_this_test(target_client, draft_client):
    """Power: speculative sampling of the target's own distribution, counted against the
    contrastive law, is rejected (the two differ on these models)."""
    p = params(OBRIEN)
    expected = contrastive_joint(p, 1.0)
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False, top_n=0))
    counts = Counter(tuple(r.token_ids) for r in run_seeds(lambda seed: loop.generate(
        PROMPT, 2, SamplingParams(temperature=1.0, seed=seed), 0), 600))
    on_support = Counter({c: n for c, n in counts.items() if c in expected})
    outside = sum(counts.values()) - sum(on_support.values())
    assert outside > 0 or chi_square_p_value(on_support, expected, 600) < 1e-3


@pytest.mark.slow
@pytest.mark.long
def test_pipelined_rounds_keep_the_contrastive_distribution(draft_client, target_client):
    """Pipelined speculative form, K = 1: round 2's draft comes from a pre-draft whenever
    round 1's draft and guessed bonus held (about a third of generations here), else from a
    fresh Propose. Both the joint law of the four tokens and the law of token 3 (round
    2's first, where a pre-drafted draft is verified; fewer cells, more power) are the
    contrastive ones."""
    p, temperature = params(OBRIEN, alpha=0.3, beta=0.1), 0.8
    joint = contrastive_joint(p, temperature, n=4)
    third: dict[tuple[int, ...], float] = {}
    for cell, prob in joint.items():
        third[cell[2:3]] = third.get(cell[2:3], 0.0) + prob
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=True))
    results = run_seeds(lambda seed: loop.generate(
        PROMPT, 4, SamplingParams(temperature=temperature, seed=seed), num_draft_tokens=1,
        contrastive=p), TRIALS)
    counts = Counter(tuple(r.token_ids) for r in results)
    used = sum(r.stats.pipelined_rounds for r in results)
    assert TRIALS // 10 < used < TRIALS * 9 // 10  # both paths, each often
    thirds = Counter()
    for cell, n in counts.items():
        thirds[cell[2:3]] += n
    p_joint = chi_square_p_value(counts, joint, TRIALS)
    p_third = chi_square_p_value(thirds, third, TRIALS)
    print(f"chi-square p = {p_joint:.3f} (joint, {len(joint)} cells), {p_third:.3f} (token 3, "
          f"{len(third)} cells); pre-drafts used in {used} of {TRIALS}")
    assert p_joint > 1e-3, (p_joint, counts.most_common(8))
    assert p_third > 1e-3, (p_third, thirds.most_common(8))
