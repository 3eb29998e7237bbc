"""specdec.verify: statistical exactness of whole rounds (emitted tokens distributed as p)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.sampling import SamplingParams, process_logits, sample, truncate
from specdec.verify import SparseQ, TargetRound, decide, target_round

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
