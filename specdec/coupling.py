"""Gumbel-max draws whose noise is keyed by (seed, token id): two parties that draw from
different distributions with the same seed pick the same token as often as the two
distributions allow, with no message between them.

The Gumbel-max trick (Maddison, Tarlow & Minka 2014, "A* Sampling"): argmax_x of
log p(x) + G_x, with G_x iid standard Gumbel, is an exact draw from p. Drawing from p and
from q with the same G couples the two draws; Daliri, Musco & Suresh 2024 ("Coupling
without Communication and Drafter-Invariant Speculative Decoding") show they differ with
probability at most 2 TV(p, q) / (1 + TV(p, q)).

Used by pipelined contrastive rounds: the coordinator draws the bonus of a round whose
drafts were all accepted from p_cd, and the draft's pre-draft draws its guess at that
bonus from its own q, with the same seed. A guess that agrees lets the next round start
at once (coordinator.loop.contrastive_round). The noise is a counter-based hash of the token
id, so it does not depend on the vocabulary's size or on which ids each party holds.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.sampling import derive_seed

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of 64-bit words that scatters every bit."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def gumbel_noise(seed: int, ids: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise per token id, float64, a function of (seed, id) alone."""
    key = np.uint64(derive_seed(seed, "gumbel"))
    x = _mix(np.asarray(ids, dtype=np.uint64) * _GOLDEN + key)
    u = ((x >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53  # in (0, 1)
    return torch.from_numpy(-np.log(-np.log(u)))


def draw(ids: torch.Tensor, probs: torch.Tensor, seed: int) -> int:
    """The index (into `ids`) of one exact draw from `probs` (need not be normalised;
    zeros never come out), by Gumbel-max with the noise of `seed`."""
    scores = torch.log(probs.double()) + gumbel_noise(seed, ids)
    return int(torch.argmax(scores))
