"""specdec.verify: decision tables, the residual, and the target's share of a round."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.sampling import SamplingParams, process_logits, sample, truncate
from specdec.verify import SparseQ, TargetRound, TokenKind, decide, residual, target_round

A, R, B = TokenKind.ACCEPTED, TokenKind.RECOVERED, TokenKind.BONUS
BELOW_ONE = math.nextafter(1.0, 0.0)  # the largest uniform in [0, 1)
BELOW_HALF = math.nextafter(0.5, 0.0)


# -- decide: table tests --------------------------------------------------------------

DRAFTS = [5, 6, 7]
RECOVERED = [50, 60, 70]
BONUS = 99


@pytest.mark.parametrize(
    "target_probs, q_probs, uniforms, expected_tokens, expected_kinds, expected_accepted",
    [
        pytest.param([0.1, 0.9, 0.9], [0.5, 0.5, 0.5], [0.5, 0.0, 0.0],
                     [50], [R], 0, id="reject-at-0"),
        pytest.param([0.4, 0.1, 0.9], [0.5, 0.5, 0.5], [0.7, 0.3, 0.0],
                     [5, 60], [A, R], 1, id="reject-at-1"),
        pytest.param([0.4, 0.3, 0.1], [0.5, 0.5, 0.5], [0.7, 0.5, 0.3],
                     [5, 6, 70], [A, A, R], 2, id="reject-at-last"),
        pytest.param([0.4, 0.3, 0.2], [0.5, 0.5, 0.5], [0.7, 0.5, 0.3],
                     [5, 6, 7, 99], [A, A, A, B], 3, id="all-accepted-bonus"),
        pytest.param([0.6, 0.5, 1.0], [0.5, 0.5, 0.25], [BELOW_ONE] * 3,
                     [5, 6, 7, 99], [A, A, A, B], 3, id="p>=q-accepts-u-near-1"),
        pytest.param([0.3, 0.2, 0.9], [0.3, 0.1, 0.2], [BELOW_ONE] * 3,
                     [5, 6, 7, 99], [A, A, A, B], 3, id="p>=q-small-values"),
        # u * q == p exactly (0.5 * 0.5 == 0.25): the rule is strict, so reject.
        pytest.param([0.25, 0.9, 0.9], [0.5, 0.5, 0.5], [0.5, 0.0, 0.0],
                     [50], [R], 0, id="boundary-rejects-at-0"),
        pytest.param([0.9, 0.125, 0.9], [0.5, 0.25, 0.5], [0.0, 0.5, 0.0],
                     [5, 60], [A, R], 1, id="boundary-rejects-at-1"),
        # Just below the boundary accepts.
        pytest.param([0.25, 0.125, 0.9], [0.5, 0.25, 0.5], [BELOW_HALF, BELOW_HALF, 0.0],
                     [5, 6, 7, 99], [A, A, A, B], 3, id="just-below-boundary-accepts"),
        # p(x) = 0 rejects even with u = 0.
        pytest.param([0.0, 0.9, 0.9], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0],
                     [50], [R], 0, id="p-zero-rejects-u-zero"),
        # Greedy: p in {0, 1}, q = 1.
        pytest.param([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [BELOW_ONE, 0.5, 0.0],
                     [5, 6, 7, 99], [A, A, A, B], 3, id="greedy-all-match"),
        pytest.param([1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [BELOW_ONE, 0.0, 0.0],
                     [5, 60], [A, R], 1, id="greedy-mismatch-at-1"),
        pytest.param([0.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0],
                     [50], [R], 0, id="greedy-mismatch-at-0"),
        pytest.param([1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.999, 0.999, 0.999],
                     [5, 6, 70], [A, A, R], 2, id="greedy-mismatch-at-last"),
    ],
)
def test_decide_table(target_probs, q_probs, uniforms, expected_tokens, expected_kinds,
                      expected_accepted):
    target = TargetRound(target_probs, RECOVERED, BONUS)
    d = decide(DRAFTS, q_probs, target, uniforms)
    assert d.tokens == expected_tokens
    assert d.kinds == expected_kinds
    assert d.num_accepted == expected_accepted
    assert len(d.tokens) == len(d.kinds) == d.num_accepted + 1
    assert d.tokens[: d.num_accepted] == DRAFTS[: d.num_accepted]


@pytest.mark.parametrize(
    "target_probs, q_probs, u, accepted",
    [
        ([0.2], [0.8], [0.24], True),  # 0.192 < 0.2
        ([0.2], [0.8], [0.25], False),  # 0.2 == 0.2: strict
        ([0.2], [0.8], [0.26], False),
        ([0.9], [0.3], [BELOW_ONE], True),
        ([1e-6], [1.0], [0.0], True),
    ],
)
def test_decide_k1(target_probs, q_probs, u, accepted):
    d = decide([3], q_probs, TargetRound(target_probs, [30], 31), u)
    if accepted:
        assert (d.tokens, d.kinds, d.num_accepted) == ([3, 31], [A, B], 1)
    else:
        assert (d.tokens, d.kinds, d.num_accepted) == ([30], [R], 0)


def test_decide_k0_emits_only_the_bonus():
    d = decide([], [], TargetRound([], [], 17), [])
    assert d.tokens == [17]
    assert d.num_accepted == 0
    assert len(d.kinds) == 1


def test_decide_ignores_extra_uniforms_and_later_positions_after_rejection():
    # Position 1 is rejected; whatever positions 2.. say must not matter.
    target = TargetRound([0.9, 0.0, float("nan")], RECOVERED, BONUS)
    d = decide(DRAFTS, [0.5, 0.5, 0.5], target, [0.1, 0.1, 0.1, 0.1])
    assert d.tokens == [5, 60]


# -- residual -------------------------------------------------------------------------


def test_residual_hand_example_sparse_q():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = SparseQ(torch.tensor([3, 1]), torch.tensor([0.5, 0.5]))
    # p - q = [.1, -.3, .3, -.1] -> max(0, .) = [.1, 0, .3, 0] -> / .4
    torch.testing.assert_close(residual(p, q), torch.tensor([0.25, 0.0, 0.75, 0.0]))


def test_residual_q_outside_p_support():
    p = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0])
    q = SparseQ(torch.tensor([0, 1, 4]), torch.tensor([0.6, 0.3, 0.1]))
    torch.testing.assert_close(residual(p, q), torch.tensor([0.0, 2 / 7, 5 / 7, 0.0, 0.0]))


def test_residual_one_hot_q():
    p = torch.tensor([0.2, 0.5, 0.3])
    torch.testing.assert_close(residual(p, SparseQ.one_hot(1)), torch.tensor([0.4, 0.0, 0.6]))


def test_residual_falls_back_to_p_when_p_equals_q():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = SparseQ(torch.tensor([2, 0, 3, 1]), torch.tensor([0.3, 0.1, 0.4, 0.2]))
    assert torch.equal(residual(p, q), p)
    one_hot = torch.tensor([0.0, 0.0, 1.0])
    assert torch.equal(residual(one_hot, SparseQ.one_hot(2)), one_hot)


def test_sparse_q_prob_of():
    q = SparseQ(torch.tensor([7, 2, 9]), torch.tensor([0.5, 0.3, 0.2]))
    assert q.prob_of(2) == pytest.approx(0.3)
    assert q.prob_of(9) == pytest.approx(0.2)
    assert q.prob_of(3) == 0.0
    assert SparseQ.one_hot(4).prob_of(4) == 1.0


# -- target_round ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_target_round_greedy(seed):
    g = torch.Generator().manual_seed(seed)
    k, vocab = 4, 9
    logits = torch.randn(k + 1, vocab, generator=g)
    p = process_logits(logits, SamplingParams())
    argmax = logits.argmax(-1).tolist()
    # Draft matches the argmax at some positions, not at others.
    match = torch.rand(k, generator=g) < 0.5
    drafts = [argmax[i] if match[i] else (argmax[i] + 1 + seed % (vocab - 1)) % vocab
              for i in range(k)]
    tr = target_round(p, drafts, None, torch.Generator().manual_seed(1000 + seed))
    assert tr.target_probs == [1.0 if drafts[i] == argmax[i] else 0.0 for i in range(k)]
    assert tr.recovered_tokens == argmax[:k]
    assert tr.bonus_token == argmax[k]
    # And the decision is greedy decoding: accept up to the first mismatch.
    d = decide(drafts, [1.0] * k, tr, [BELOW_ONE] * k)
    first_bad = next((i for i in range(k) if drafts[i] != argmax[i]), k)
    assert d.num_accepted == first_bad
    assert d.tokens == argmax[: first_bad + 1]


def test_target_round_q_equal_p_accepts_everything():
    vocab, k = 10, 3
    g = torch.Generator().manual_seed(4)
    p = process_logits(torch.randn(k + 1, vocab, generator=g), SamplingParams(temperature=1.0))
    qs = [SparseQ(torch.arange(vocab), p[i].clone()) for i in range(k)]
    for trial in range(20):
        drafts = [sample(p[i], g) for i in range(k)]
        tr = target_round(p, drafts, qs, torch.Generator().manual_seed(trial))
        q_probs = [qs[i].prob_of(x) for i, x in enumerate(drafts)]
        assert tr.target_probs == q_probs
        for u in [0.0, 0.3, 0.9, BELOW_ONE]:
            d = decide(drafts, q_probs, tr, [u] * k)
            assert d.num_accepted == k
            assert d.tokens == drafts + [tr.bonus_token]


@pytest.mark.parametrize("seed", range(8))
def test_target_round_recovered_in_residual_support(seed):
    vocab, k = 12, 3
    g = torch.Generator().manual_seed(seed)
    p = process_logits(torch.randn(k + 1, vocab, generator=g), SamplingParams(temperature=1.0,
                                                                            top_k=6))
    q_dense = process_logits(torch.randn(k, vocab, generator=g), SamplingParams(temperature=1.0))
    qs = [SparseQ(*truncate(q_dense[i], 4)) for i in range(k)]
    drafts = [int(qs[i].token_ids[sample(qs[i].probs, g)]) for i in range(k)]
    for trial in range(10):
        tr = target_round(p, drafts, qs, torch.Generator().manual_seed(trial))
        for i in range(k):
            assert tr.target_probs[i] == float(p[i, drafts[i]])
            assert residual(p[i], qs[i])[tr.recovered_tokens[i]] > 0
        assert p[k, tr.bonus_token] > 0


def test_target_round_is_deterministic_given_the_generator():
    vocab, k = 10, 3
    g = torch.Generator().manual_seed(1)
    p = process_logits(torch.randn(k + 1, vocab, generator=g), SamplingParams(temperature=1.0))
    qs = [SparseQ(*truncate(p[i].roll(1), vocab)) for i in range(k)]
    drafts = [1, 2, 3]
    runs = [target_round(p, drafts, qs, torch.Generator().manual_seed(77)) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    others = {tuple(target_round(p, drafts, qs, torch.Generator().manual_seed(s)).recovered_tokens)
              for s in range(30)}
    assert len(others) > 1


def test_target_round_needs_k_plus_one_rows():
    p = torch.full((3, 4), 0.25)
    with pytest.raises(AssertionError):
        target_round(p, [0, 1, 2], None, torch.Generator().manual_seed(0))
