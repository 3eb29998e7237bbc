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
                 covered: bool = False) -> RoundResult:
    """One look-up round of `gen` (a coordinator.loop.Generation). `covered`: a pre-draft
    of the branch where the first draft is rejected is in flight
    (cover_lookup_miss); it is called off once the round emitted more than
    one token, which that branch did not assume."""
    drafts = list(found.tokens)
    dists = [] if gen.sampling.greedy else [wire.point_mass_dist(t) for t in drafts]
    t0 = time.perf_counter()
    result = gen.target.verify(gen.committed, drafts, dists, gen.sampling, round_seed)
    verify_s = time.perf_counter() - t0
    decision = decide(drafts, [1.0] * len(drafts), result, uniforms(gen, u, len(drafts)))
    if covered and len(decision.tokens) > 1:
        gen.predrafts.pending.call_off()
    return RoundResult(decision, len(drafts), verify_s,
                       target_pass=(result.pass_sessions, result.pass_tokens,
                                    result.pass_seconds),
                       source=LOOKUP)


def cover_lookup_miss(gen, committed: list[int], k: int, remaining: int, n: int) -> bool:
    """Before a look-up round of n drafts: the draft model, idle while the target
    verifies them, pre-drafts the branch where the first is rejected, from the committed
    ids with its own first token standing in for the recovered one (lead=1). The look-up
    covers the copy, the draft the rest. Not when this round may end the generation (as
    for every pre-draft). True if started."""
    pre = gen.predrafts
    if pre is None:
        return False
    # Settle the pending pre-draft: called off, or waited for if it is the prefill's
    # (never called off; it is about done by now). Whatever the timing, the same.
    pre.take(committed, 0)
    max_propose = gen.loop.max_propose
    if not (gen.drafters.uses_model and 0 < k and max_propose >= 3 and n + 2 < remaining
            and gen.draft.ready()):
        return False
    pre.start(gen.committed, committed, min(k, max_propose - 2), gen.exit_below,
              lead=1, branch="lookup-miss", **gen.guess_for(gen.round_index + 1))
    return True
