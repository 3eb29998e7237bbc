"""specdec.verify: decision tables, the target's share of a round, and statistical
exactness of whole speculative rounds (emitted tokens must be distributed as p)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

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


# -- statistical exactness ------------------------------------------------------------

VOCAB = 10
MIN_P_VALUE = 1e-3


def _dist(logits: torch.Tensor, **kw) -> torch.Tensor:
    return process_logits(logits, SamplingParams(temperature=kw.pop("temperature", 1.0), **kw))


def _sparse(probs: torch.Tensor, top_n: int = VOCAB) -> SparseQ:
    return SparseQ(*truncate(probs, top_n))


def _make_cases() -> dict[str, tuple[torch.Tensor, SparseQ]]:
    g = torch.Generator().manual_seed(20240601)
    p_logits = torch.randn(VOCAB, generator=g) * 1.2
    p = _dist(p_logits)
    far_logits = torch.randn(VOCAB, generator=g) * 2.0
    mode = int(p.argmax())
    no_mode_logits = p_logits.clone()
    no_mode_logits[mode] = -math.inf
    p_sparse = _dist(p_logits, top_k=4)
    return {
        "q-close-to-p": (p, _sparse(_dist(p_logits + 0.3 * torch.randn(VOCAB, generator=g)))),
        "q-far-from-p": (p, _sparse(_dist(far_logits))),
        "q-top3-truncated": (p, _sparse(_dist(far_logits), top_n=3)),
        "q-misses-p-mode": (p, _sparse(_dist(no_mode_logits))),
        "q-equals-p": (p, _sparse(p)),
        "p-top4-q-full": (p_sparse, _sparse(_dist(p_logits * 0.5))),
    }


CASES = _make_cases()


def _draft(q: SparseQ, g: torch.Generator) -> tuple[int, float]:
    """What the draft does: sample from exactly the sparse q it reports."""
    j = sample(q.probs, g)
    return int(q.token_ids[j]), float(q.probs[j])


def speculate(
    p_at: Callable[[int], torch.Tensor],
    q_at: Callable[[int], SparseQ],
    k: int,
    length: int,
    seed: int,
    mode: str = "exact",
) -> list[int]:
    """Generate `length` tokens by speculative rounds in a context-free world where the
    target's p and the draft's q depend on the absolute position only.

    mode "exact" uses the real functions; "no-rejection" emits every draft plus the bonus
    (a broken verifier); "recover-from-p" recovers from p instead of the residual.
    """
    g_draft = torch.Generator().manual_seed(seed)
    g_target = torch.Generator().manual_seed(seed + 1)
    g_uniform = torch.Generator().manual_seed(seed + 2)
    out: list[int] = []
    while len(out) < length:
        pos = len(out)
        qs = [q_at(pos + i) for i in range(k)]
        drawn = [_draft(q, g_draft) for q in qs]
        drafts = [x for x, _ in drawn]
        q_probs = [qx for _, qx in drawn]
        p_rows = torch.stack([p_at(pos + i) for i in range(k + 1)])
        tr = target_round(p_rows, drafts, qs, g_target)
        u = torch.rand(k, generator=g_uniform, dtype=torch.float64).tolist()
        if mode == "no-rejection":
            out.extend(drafts + [tr.bonus_token])
            continue
        if mode == "recover-from-p":
            wrong = [sample(p_rows[i], g_target) for i in range(k)]
            tr = TargetRound(tr.target_probs, wrong, tr.bonus_token)
        d = decide(drafts, q_probs, tr, u)
        assert d.tokens[: d.num_accepted] == drafts[: d.num_accepted]
        out.extend(d.tokens)
    return out[:length]


def gof_p_value(tokens: list[int], p: torch.Tensor) -> float:
    """Chi-square goodness of fit of `tokens` against p; tokens outside p's support fail."""
    counts = np.bincount(np.asarray(tokens), minlength=len(p)).astype(np.float64)
    p64 = p.double().numpy()
    support = p64 > 0
    assert counts[~support].sum() == 0, f"emitted tokens outside p's support: {counts}"
    expected = p64[support] / p64[support].sum() * counts.sum()
    assert expected.min() >= 5, "too few samples for a chi-square test"
    return float(chisquare(counts[support], f_exp=expected).pvalue)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_rounds_emit_tokens_distributed_as_p(case, k):
    p, q = CASES[case]
    tokens = speculate(lambda _: p, lambda _: q, k, length=20_000, seed=1234 + k)
    assert gof_p_value(tokens, p) > MIN_P_VALUE


def test_acceptance_rate_matches_theory():
    """With K = 1 the acceptance probability is sum_x min(p(x), q(x))."""
    p, q = CASES["q-far-from-p"]
    qd = torch.zeros(VOCAB)
    qd[q.token_ids] = q.probs
    alpha = float(torch.minimum(p, qd).sum())
    g = torch.Generator().manual_seed(5)
    gt = torch.Generator().manual_seed(6)
    n, accepted = 20_000, 0
    rows = torch.stack([p, p])
    for _ in range(n):
        x, qx = _draft(q, g)
        tr = target_round(rows, [x], [q], gt)
        accepted += decide([x], [qx], tr, torch.rand(1, generator=g).tolist()).num_accepted
    sd = math.sqrt(alpha * (1 - alpha) / n)
    assert abs(accepted / n - alpha) < 5 * sd
    assert 0.05 < alpha < 0.95  # the case really exercises both outcomes


@pytest.mark.parametrize("mode", ["no-rejection", "recover-from-p"])
def test_negative_control_broken_verifier_is_detected(mode):
    """The chi-square test has power: a verifier that skips rejection, or recovers from
    p instead of norm(max(0, p - q)), is caught on a clearly different q."""
    p, q = CASES["q-far-from-p"]
    tokens = speculate(lambda _: p, lambda _: q, 3, length=10_000, seed=99, mode=mode)
    assert gof_p_value(tokens, p) < 1e-6


@pytest.mark.parametrize("k", [1, 3])
def test_position_dependent_p_first_and_second_token(k):
    """p and q differ by position; the token at position j must follow p_j. With K = 1
    the second token is often the bonus, so it checks that the bonus comes from p_{K+1}."""
    g = torch.Generator().manual_seed(77)
    ps = [_dist(torch.randn(VOCAB, generator=g) * 1.5) for _ in range(5)]
    qs = [_sparse(_dist(torch.randn(VOCAB, generator=g) * 1.5), top_n=5) for _ in range(4)]
    n = 6_000
    first: list[int] = []
    second: list[int] = []
    for s in range(n):
        t = speculate(lambda i: ps[i], lambda i: qs[i], k, length=2, seed=10 * s)
        first.append(t[0])
        second.append(t[1])
    assert gof_p_value(first, ps[0]) > MIN_P_VALUE
    assert gof_p_value(second, ps[1]) > MIN_P_VALUE
    # Power: position 0 is not distributed as p_1 (the distributions differ clearly).
    assert gof_p_value(first, ps[1]) < 1e-6
