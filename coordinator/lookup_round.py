"""A round drafted by the look-up (coordinator.lookup): no draft service involved.

The drafts are verified by the same Verify and decided by the same `decide` as a draft
model's. In sampled mode each draft's q is a point mass on it (it was chosen, not drawn,
and a deterministic choice is a draw from the point mass), so x_i is accepted with
probability p_i(x_i) and a rejection resamples from norm(max(0, p_i - q_i)), which is p_i
without x_i: the output keeps the target's distribution (Leviathan et al. 2023, with q
one-hot). Greedy rounds send no distributions at all, as always.
"""

from __future__ import annotations

import time

import torch

from coordinator.hybrid import LOOKUP
from coordinator.lookup import Lookup
from coordinator.record import RoundResult
from specdec import wire
from specdec.sampling import generator
from specdec.verify import decide


def uniforms(gen, u: list[float], n: int) -> list[float]:
    """n uniforms for this round: the K the round drew from the generation's stream, then
    (a look-up may draft more than K) from a stream of the round's own, so that the
    generation's stream still advances by exactly K per round whatever drafts a round."""
    if n <= len(u):
        return u[:n]
    extra = generator(gen.sampling.seed, "lookup-uniforms", gen.round_index)
    return u + torch.rand(n - len(u), generator=extra, dtype=torch.float64).tolist()


def lookup_round(gen, found: Lookup, round_seed: int, u: list[float],
                 committed: list[int]) -> RoundResult:
    """One look-up round of `gen` (a coordinator.loop.Generation) after `committed`.

    A pending pre-draft is settled first: called off, or waited for if it is the
    prefill's (never called off; it is about done by now), the same whatever the timing.
    The draft model is left idle meanwhile: a pre-draft of "the first look-up draft
    rejected" was tried and never used (0 of 22 on the shipped prompts), and on a shared
    machine the draft's passes slowed the target's Verify (memory bandwidth)."""
    if gen.predrafts is not None:
        gen.predrafts.take(committed, 0)
    drafts = list(found.tokens)
    dists = [] if gen.sampling.greedy else [wire.point_mass_dist(t) for t in drafts]
    t0 = time.perf_counter()
    result = gen.target.verify(gen.committed, drafts, dists, gen.sampling, round_seed)
    verify_s = time.perf_counter() - t0
    decision = decide(drafts, [1.0] * len(drafts), result, uniforms(gen, u, len(drafts)))
    return RoundResult(decision, len(drafts), verify_s,
                       target_pass=(result.pass_sessions, result.pass_tokens,
                                    result.pass_seconds),
                       source=LOOKUP)
