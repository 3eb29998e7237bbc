"""Quantize-Sample-Verify in specdec.sampling: truncation by mass, quantisation to counts
summing to Q_TOTAL, and exact draws from the counts."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from specdec.errors import InvalidArgument
from specdec.sampling import Q_TOTAL, quantise, sample_counts, truncate


def _random_probs(n: int, seed: int, spread: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, generator=g) * spread, 0)


# -- truncate by mass -----------------------------------------------------------------


def test_truncate_keeps_the_fewest_tokens_holding_the_mass():
    probs = torch.tensor([0.0625, 0.5, 0.25, 0.1875])  # exact in binary
    assert truncate(probs, 64, 0.5)[0].tolist() == [1]  # 0.5 is reached by one token
    assert truncate(probs, 64, 0.51)[0].tolist() == [1, 2]
    assert truncate(probs, 64, 0.9375)[0].tolist() == [1, 2, 3]
    assert truncate(probs, 64, 0.94)[0].tolist() == [1, 2, 3, 0]
    assert truncate(probs, 2, 0.99)[0].tolist() == [1, 2]  # top_n stays the cap
    ids, q = truncate(probs, 64, 0.7)
    torch.testing.assert_close(q, torch.tensor([0.5, 0.25]) / 0.75)


def test_truncate_by_mass_of_an_unnormalised_input():
    assert truncate(torch.tensor([1.0, 6.0, 3.0]), 64, 0.89)[0].tolist() == [1, 2]
    assert truncate(torch.tensor([1.0, 6.0, 3.0]), 64, 0.91)[0].tolist() == [1, 2, 0]


def test_truncate_mass_one_is_top_n():
    probs = _random_probs(200, 0)
    assert torch.equal(truncate(probs, 64, 1.0)[0], truncate(probs, 64)[0])
    assert len(truncate(probs, 64, 1.0)[0]) == 64


@pytest.mark.parametrize("top_mass", [0.0, -0.1, 1.01, float("nan")])
def test_truncate_rejects_bad_top_mass(top_mass):
    with pytest.raises(InvalidArgument, match="top_mass"):
        truncate(torch.tensor([0.5, 0.5]), 4, top_mass)


# -- quantise ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 17, 64, 1000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantise_sums_exactly_keeps_every_token_and_stays_close(n, seed):
    probs = _random_probs(n, seed, spread=4.0)  # tails far below 1 / Q_TOTAL
    counts = quantise(probs)
    assert counts.dtype == torch.int64 and counts.shape == probs.shape
    assert int(counts.sum()) == Q_TOTAL
    assert int(counts.min()) >= 1
    # Round trip: each q(x) = count / Q_TOTAL is within n / Q_TOTAL of p(x) (the tail
    # raised to one count is paid for by the largest; the others move < 1 count).
    error = (counts.double() / Q_TOTAL - probs.double()).abs()
    assert float(error.max()) <= n / Q_TOTAL + 1e-12
    assert int((error > 1 / Q_TOTAL).sum()) <= 1 + int((probs * Q_TOTAL < 1).sum())


def test_quantise_exact_fractions_and_order():
    counts = quantise(torch.tensor([0.2, 0.4, 0.4]))
    assert counts.tolist() == [13107, 26214, 26214]
    assert quantise(torch.tensor([3.0])).tolist() == [Q_TOTAL]
    # unnormalised input, order kept
    assert quantise(torch.tensor([1.0, 3.0])).tolist() == [16384, 49151]


def test_quantise_a_long_flat_tail():
    """Many tokens below one count: each gets exactly 1, the head pays for them."""
    probs = torch.cat([torch.tensor([0.99]), torch.full((5000,), 0.01 / 5000)])
    counts = quantise(probs)
    assert int(counts.sum()) == Q_TOTAL
    assert counts[1:].tolist() == [1] * 5000
    assert int(counts[0]) == Q_TOTAL - 5000


def test_quantise_as_many_tokens_as_counts():
    counts = quantise(_random_probs(Q_TOTAL, 3))
    assert counts.tolist() == [1] * Q_TOTAL
    with pytest.raises(InvalidArgument):
        quantise(torch.full((Q_TOTAL + 1,), 1.0))


def test_quantise_is_deterministic():
    probs = _random_probs(64, 5)
    assert torch.equal(quantise(probs), quantise(probs.clone()))


# -- sample_counts ----------------------------------------------------------------------


def test_sample_counts_is_reproducible():
    counts = quantise(_random_probs(16, 1))
    a = [sample_counts(counts, torch.Generator().manual_seed(9)) for _ in range(3)]
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert [sample_counts(counts, g1) for _ in range(50)] == \
        [sample_counts(counts, g2) for _ in range(50)]
    assert len(set(a)) == 1


def test_sample_counts_draws_from_the_quantised_distribution():
    """Chi-square against count / Q_TOTAL itself, the q the target verifies against. The
    tail tokens (one count each) are pooled; one of them alone never comes out in 1/65535
    of the draws often enough to test, but their pool does."""
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625] + [0.0625 / 200] * 200)
    counts = quantise(probs)
    n = 60_000
    g = torch.Generator().manual_seed(2025)
    drawn = Counter(sample_counts(counts, g) for _ in range(n))
    assert all(0 <= j < len(counts) for j in drawn)
    observed = [drawn[j] for j in range(4)] + [sum(drawn[j] for j in range(4, len(counts)))]
    q = counts.double() / Q_TOTAL
    expected = [float(q[j]) * n for j in range(4)] + [float(q[4:].sum()) * n]
    assert chisquare(observed, expected).pvalue > 1e-3


def test_sample_counts_never_draws_a_zero_count_and_takes_any_total():
    g = torch.Generator().manual_seed(0)
    draws = [sample_counts(torch.tensor([0, 3, 0, 1]), g) for _ in range(400)]
    assert set(draws) == {1, 3}
    assert abs(draws.count(1) - 300) < 45  # binomial sd ~ 8.7
    assert {sample_counts(torch.tensor([5]), g) for _ in range(10)} == {0}
