"""specdec.contrastive against the formulas written out by hand, and the sparse (wire)
forms against the dense ones."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.contrastive import (
    LI,
    OBRIEN,
    ContrastiveParams,
    amateur_values,
    contrastive_distribution,
    greedy_token,
    head,
    head_distribution,
    plausible_mask,
    scores,
)
from specdec.errors import InvalidArgument

EXPERT = torch.tensor([2.0, 1.9, 0.0, -3.0, 1.0])
AMATEUR = torch.tensor([3.0, 0.0, 1.0, 0.0, 0.5])


def test_plausible_set_is_p_at_least_alpha_times_the_max():
    p = torch.softmax(EXPERT, -1)
    for alpha in (1.0, 0.5, 0.1, 0.01):
        expected = p >= alpha * p.max()
        assert torch.equal(plausible_mask(EXPERT, alpha), expected), alpha


def test_li_score_by_hand():
    params = ContrastiveParams(alpha=0.3, formulation=LI, amateur_temperature=2.0)
    p_exp = torch.softmax(EXPERT, -1)
    p_ama = torch.softmax(AMATEUR / 2.0, -1)
    got = scores(EXPERT, AMATEUR, params)
    for x in range(5):
        if p_exp[x] >= 0.3 * p_exp.max():
            assert got[x] == pytest.approx(math.log(p_exp[x]) - math.log(p_ama[x]), abs=1e-5)
        else:
            assert got[x] == -math.inf
    # The amateur loves token 0, so the contrast prefers token 1, the expert's runner-up.
    assert greedy_token(EXPERT, AMATEUR, params) == 1
    assert int(EXPERT.argmax()) == 0


def test_obrien_score_by_hand_and_beta_zero_is_the_expert():
    params = ContrastiveParams(alpha=0.1, beta=0.5)
    got = scores(EXPERT, AMATEUR, params)
    mask = plausible_mask(EXPERT, 0.1)
    want = torch.where(mask, 1.5 * EXPERT - 0.5 * AMATEUR, torch.tensor(-math.inf))
    assert torch.allclose(got, want)
    plain = contrastive_distribution(EXPERT, AMATEUR, ContrastiveParams(alpha=1e-9, beta=0.0))
    assert torch.allclose(plain, torch.softmax(EXPERT, -1), atol=1e-6)


@pytest.mark.parametrize("formulation", [LI, OBRIEN])
def test_distribution_is_zero_outside_the_head_and_sums_to_one(formulation):
    params = ContrastiveParams(alpha=0.2, formulation=formulation)
    p = contrastive_distribution(EXPERT, AMATEUR, params)
    assert p.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.all(p[~plausible_mask(EXPERT, 0.2)] == 0)
    greedy = contrastive_distribution(EXPERT, AMATEUR, params, temperature=0)
    assert int(greedy.argmax()) == greedy_token(EXPERT, AMATEUR, params) and greedy.sum() == 1


@pytest.mark.parametrize("formulation", [LI, OBRIEN])
def test_sparse_forms_equal_the_dense_ones(formulation):
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        expert = torch.randn(300, generator=gen) * 3
        amateur = torch.randn(300, generator=gen) * 3
        if trial % 7 == 0:
            expert[5] = expert[9] = expert.max() + 1  # a tie at the top
            amateur[5] = amateur[9]
        params = ContrastiveParams(alpha=[0.1, 0.5, 1.0, 0.01][trial % 4], beta=0.7,
                                   amateur_temperature=[1.0, 0.5][trial % 2],
                                   formulation=formulation)
        h = head(expert, params)
        dense = contrastive_distribution(expert, amateur, params, temperature=0.8)
        sparse = head_distribution(h, amateur_values(amateur, h.token_ids, params), params,
                                   temperature=0.8)
        assert torch.allclose(dense[h.token_ids], sparse, atol=1e-5)
        assert dense.sum().item() == pytest.approx(sparse.sum().item(), abs=1e-5)
        g = head_distribution(h, amateur_values(amateur, h.token_ids, params), params, 0)
        assert int(h.token_ids[g.argmax()]) == greedy_token(expert, amateur, params)


@pytest.mark.parametrize("field, value, words", [
    ("alpha", 0.0, "alpha must be in (0, 1]"), ("alpha", 1.5, "alpha must be in (0, 1]"),
    ("alpha", math.nan, "alpha"), ("beta", -0.1, "beta must be"),
    ("beta", math.inf, "beta must be"), ("amateur_temperature", 0.0, "amateur_temperature"),
    ("formulation", "x", "formulation must be")])
def test_validation_names_the_parameter(field, value, words):
    with pytest.raises(InvalidArgument, match=words.replace("(", r"\(").replace("]", r"\]")):
        ContrastiveParams(**{field: value}).validate()


def test_reference_decoder_on_the_tiny_models():
    """The in-process reference on tiny-random (expert) and tiny-random-draft (amateur):
    every step is the formula's argmax over the two models' logits, and it differs from
    the expert's own greedy output (the contrast does something)."""
    from specdec.runtime.models import build_tiny
    from specdec_tools.contrastive_reference import decode, last_logits

    expert, amateur = build_tiny("tiny-random").model, build_tiny("tiny-random-draft").model
    prompt = [5, 17, 42, 99]
    params = ContrastiveParams(alpha=0.1, beta=0.5)
    out = decode(expert, amateur, prompt, 12, params)
    ids = list(prompt)
    for token in out:
        e, a = last_logits(expert, ids), last_logits(amateur, ids)
        assert token == int(scores(e, a, params).argmax())
        assert plausible_mask(e, 0.1)[token]
        ids.append(token)
    plain = decode(expert, amateur, prompt, 12, ContrastiveParams(alpha=1.0, beta=0.0))
    assert plain == [int(t) for t in _expert_greedy(expert, prompt, 12)]
    assert out != plain


def _expert_greedy(model, prompt, n):
    from specdec_tools.contrastive_reference import last_logits

    ids = list(prompt)
    for _ in range(n):
        ids.append(int(last_logits(model, ids).argmax()))
    return ids[len(prompt):]
