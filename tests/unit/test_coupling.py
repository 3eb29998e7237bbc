"""specdec.coupling: Gumbel-max draws keyed by (seed, token id) are exact draws, and two
distributions drawn with the same seed agree as often as the coupling bound says."""

from __future__ import annotations

from collections import Counter

import torch
from scipy.stats import chisquare

from specdec.coupling import draw, gumbel_noise

IDS = torch.tensor([3, 5, 9, 700, 49151])
P = torch.tensor([0.45, 0.25, 0.15, 0.15, 0.0])


def test_a_draw_follows_its_distribution():
    n = 20000
    counts = Counter(draw(IDS, P, seed) for seed in range(n))
    assert 4 not in counts  # probability 0 never comes out
    observed = [counts[i] for i in range(4)]
    assert chisquare(observed, [float(x) * n for x in P[:4]]).pvalue > 1e-3


def test_the_noise_belongs_to_the_id_not_to_the_list():
    """Each party may hold other ids, in another order: an id's noise is the same."""
    a = gumbel_noise(11, IDS)
    b = gumbel_noise(11, torch.tensor([49151, 9, 1, 3]))
    assert b[0] == a[4] and b[1] == a[2] and b[3] == a[0]
    assert not torch.equal(gumbel_noise(12, IDS), a)  # and it changes with the seed


def test_two_distributions_agree_as_the_coupling_bound_says():
    q = torch.tensor([0.35, 0.35, 0.15, 0.05, 0.10])  # TV(P, q) = 0.2
    n = 5000
    agree = sum(draw(IDS, P, s) == draw(IDS, q, s) for s in range(n)) / n
    tv = 0.2
    assert agree >= 1 - 2 * tv / (1 + tv) - 0.03  # Daliri et al. 2024's bound, less noise
    assert agree <= 1 - tv + 0.03  # no coupling beats 1 - TV
    assert all(draw(IDS, P, s) == draw(IDS, P * 3, s) for s in range(200))  # unnormalised
