"""One round of contrastive decoding over the two services (docs/design.md, section 17).

The target is the expert, the draft the amateur (specdec.contrastive has the formulas:
Li et al. 2022 and O'Brien & Lewis 2023).

- Plain form (K = 0): the draft feeds the committed tail and keeps its logits while the
  target returns V_head at the next position; the draft then looks its values up on
  V_head, and the coordinator takes the score's argmax or samples softmax(score / T).
- Speculative form (Yuan et al. 2023, "Speculative Contrastive Decoding"): the draft
  proposes x_1..x_K from its own q, keeping its logits; it feeds x_K while the target
  returns V_head at the K+1 positions; then it looks its values up on each V_head. The
  coordinator builds the contrastive p on each V_head and hands it to specdec.verify
  (target_round, decide) in place of the target's p, so accept/resample is lossless
  with respect to the contrastive distribution: greedy output equals the plain form's,
  and sampled output follows the same distribution.

Pipelined (the loop's --pipeline, the default): while the target verifies, the draft
feeds x_K as the first step of a pre-draft of the next round (coordinator.loop.predraft),
its own next token standing in for the bonus; the read-only Score then reads the rows beside
that pre-draft (a read-only Score), and the next round uses its drafts when all K were
accepted and the bonus is that guess. The pre-draft changes where the draft computes,
never what: the rows depend on the ids alone, so outputs are the same either way.

Nothing vocabulary-sized crosses the wire: V_head's ids and values go up from the
target, the same ids down to the draft and its values back. Both services keep the
cache-sync rule: the target holds committed + drafts as after any Verify, the draft
committed + drafts after its Score.
"""

from __future__ import annotations

import logging
import time

import torch

from coordinator.record import RoundResult
from coordinator.remote.link import AmateurUnavailable
from specdec import coupling, wire
from specdec.contrastive import ContrastiveParams, head_distribution
from specdec.propose import ProposeOptions
from specdec.sampling import derive_seed, generator
from specdec.verify import Decision, TokenKind, decide, target_round

log = logging.getLogger(__name__)


def contrastive_p(heads, amateur, params: ContrastiveParams, temperature: float,
                  size: int) -> torch.Tensor:
    """The contrastive distribution at each position, dense over `size` ids [n, size]
    (zero outside V_head): what specdec.verify takes as the target's p."""
    p = torch.zeros(len(heads), size)
    for i, (h, a) in enumerate(zip(heads, amateur, strict=True)):
        p[i, h.token_ids] = head_distribution(h, a, params, temperature)
    return p


def contrastive_round(gen, k: int, remaining: int, params: ContrastiveParams) -> RoundResult:
    """One round of at most k drafts (k = 0: the plain form) of `gen`, a
    coordinator.loop.Generation (its links, committed ids, pre-drafts, record and random
    streams); `remaining` tokens are still wanted. A draft that fails is replaced by
    another replica at once and the round repeated with the same random draws (the
    output does not depend on which replica answers); with none left, UNAVAILABLE."""
    round_seed = derive_seed(gen.sampling.seed, "round", gen.round_index)
    u = torch.rand(max(k, 0), generator=gen.uniforms, dtype=torch.float64).tolist()
    t0 = time.perf_counter()
    pre = gen.predrafts.take(gen.committed.tokens, k) if gen.predrafts is not None else None
    waited = time.perf_counter() - t0 if pre is not None else 0.0
    try:
        return _round(gen, k, remaining, params, round_seed, u, pre, waited)
    except AmateurUnavailable as e:
        leaving = gen.draft.failed_address
        if gen.predrafts is not None:
            gen.predrafts.drop()
        if not gen.draft.repin_now():
            raise
        log.warning("contrastive round: draft %s failed (%s); repeating the round on %s",
                    leaving, e, gen.draft.replica.address)
        return _round(gen, k, remaining, params, round_seed, u, None, 0.0)


def _round(gen, k: int, remaining: int, params: ContrastiveParams, round_seed: int,
           u: list[float], proposal, waited: float) -> RoundResult:
    """Propose -> verify -> decide -> observe."""
    proposal, propose_s = _propose(gen, k, params, proposal)
    drafts = proposal.tokens[:k] if proposal is not None else []
    dists = proposal.dists[:len(drafts)] if proposal is not None else []
    seq = gen.committed.extended(drafts)
    # The draft's forward (the last committed token, or x_K) runs while the target's does:
    # as a pre-draft's first step when the next round could use its drafts, else alone.
    pipelined = gen.predrafts is not None and bool(drafts) and \
        len(drafts) < gen.loop.max_propose and len(drafts) + 2 < remaining
    # Sampled rounds with drafts draw the bonus by Gumbel-max with this seed's noise; the
    # pre-draft draws its guess at it with the same noise (specdec.coupling).
    bonus_seed = derive_seed(gen.sampling.seed, "bonus", gen.round_index) \
        if drafts and not gen.sampling.greedy else None
    t0 = time.perf_counter()
    expert, amateur, guess = _verify(gen, drafts, seq, params, round_seed, pipelined,
                                     bonus_seed)
    verify_s = time.perf_counter() - t0  # the round's cost beyond drafting (adaptive K)
    decision = _decide(gen, expert, amateur, drafts, dists, proposal, params, u, round_seed,
                       bonus_seed)
    if pipelined:  # a rejection, or a bonus other than the guess, calls the pre-draft off
        gen.predrafts.expect(gen.committed.tokens + decision.tokens,
                             [guess] if guess is not None else [])
    return RoundResult(decision, len(drafts), verify_s, propose_s,
                       len(proposal.tokens) if propose_s is not None else 0, False,
                       (expert.pass_sessions, expert.pass_tokens, expert.pass_seconds),
                       proposal.step_seconds if proposal is not None else 0.0, waited)


def _propose(gen, k: int, params: ContrastiveParams, proposal):
    """The round's drafts: the pre-draft's, else a fresh Propose (k > 0); (proposal,
    its seconds or None when it was pre-drafted or not needed)."""
    if k <= 0 or proposal is not None:
        return proposal, None
    t0 = time.perf_counter()
    # The amateur proposes from its own plausible set: the expert's acceptance is zero
    # outside its V_head, and the two sets mostly agree (lossless whatever q is).
    proposal = gen.draft.propose(gen.committed, gen.sampling, ProposeOptions(
        num_tokens=k, top_n=gen.policy.top_n, keep_logits=True, min_p=params.alpha))
    if proposal is None:
        raise AmateurUnavailable("contrastive decoding needs the draft service (the "
                                 "amateur), which is failing; retry later")
    return proposal, time.perf_counter() - t0


def _verify(gen, drafts: list[int], seq, params: ContrastiveParams, round_seed: int,
            pipelined: bool, bonus_seed: int | None):
    """The expert's V_head at every position and the amateur's values on them; (expert,
    amateur, the pre-draft's guess at the bonus or None)."""
    feed = None
    if pipelined:
        gen.predrafts.start(gen.committed, seq.tokens, ProposeOptions(
            num_tokens=len(drafts), keep_logits=True, min_p=params.alpha,
            guess_seed=bonus_seed), lead=1, guess=False)
    else:
        feed = gen.loop.amateur_pool.submit(gen.draft.score, seq, [], params, 1)
    try:
        expert = gen.target.verify(gen.committed, drafts, [], gen.sampling, round_seed,
                                   params)
    except BaseException:
        if feed is not None:
            feed.exception()  # let the draft's call end; the target's error is the one to see
        raise
    amateur, guess = None, None
    if feed is not None:
        feed.result()
    else:
        read = gen.draft.score_read_only(seq, expert.heads, params)
        if read is None:  # the draft does not hold seq beside the pre-draft
            gen.predrafts.drop()
        else:
            amateur, guess = read
    if amateur is None:
        amateur = gen.draft.score(seq, expert.heads, params)
    gen.record.heads([len(h.token_ids) for h in expert.heads])
    return expert, amateur, guess


def _decide(gen, expert, amateur, drafts: list[int], dists: list, proposal,
            params: ContrastiveParams, u: list[float], round_seed: int,
            bonus_seed: int | None) -> Decision:
    """Accept / resample against the contrastive p (specdec.verify), lossless."""
    ids = [int(h.token_ids.max()) for h in expert.heads] + drafts
    qs = None
    if dists:
        qs = [wire.dist_from_proto(d, f"dists[{i}]") for i, d in enumerate(dists)]
        ids += [int(q.token_ids.max()) for q in qs]
    p = contrastive_p(expert.heads, amateur, params, gen.sampling.temperature, 1 + max(ids))
    result = target_round(p, drafts, qs, generator(round_seed, "verify"))
    if not drafts:
        return Decision([result.bonus_token], [TokenKind.TARGET], 0)
    q = [proposal.draft_prob(i) for i in range(len(drafts))]
    decision = decide(drafts, q, result, u[:len(drafts)])
    if bonus_seed is not None and decision.num_accepted == len(drafts):
        # All accepted: the bonus is a fresh draw from p_cd at position K+1, here by
        # Gumbel-max (exact; only the noise differs from target_round's draw).
        head_ids = expert.heads[len(drafts)].token_ids
        j = coupling.draw(head_ids, p[len(drafts), head_ids], bonus_seed)
        decision.tokens[-1] = int(head_ids[j])
    return decision
