"""The math of lossless speculative sampling, as pure functions.

Names follow Leviathan et al. (2023) and Chen et al. (2023): `p` is the target's
distribution, `q` the draft's, `x_1..x_K` the drafted tokens. A round emits

  * accepted tokens: x_i is kept while u_i < min(1, p_i(x_i) / q_i(x_i));
  * one recovered token at the first rejection j, sampled from norm(max(0, p_j - q_j));
  * or, when all K are accepted, one bonus token sampled from p_{K+1}.

The work is split so that nothing vocabulary-sized crosses the wire: the target,
which holds the full p, computes `target_round` (p_i(x_i), one pre-drawn recovered
sample per position, the bonus); the coordinator, which holds q_i(x_i) and draws the
uniforms, calls `decide`. Using the pre-drawn recovered sample only at the first
rejection is distributionally the same as drawing it then.

Greedy is the one-hot case: p and q are one-hot, so x_i is accepted exactly when it is
the target's argmax, and recovered and bonus tokens are argmaxes. No special code.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.sampling import Q_TOTAL, densify, sample


class TokenKind(enum.IntEnum):
    """Values match specdec.v1.TokenKind on the wire."""

    ACCEPTED = 1
    RECOVERED = 2
    BONUS = 3
    TARGET = 4


@dataclass(frozen=True)
class SparseQ:
    """A draft distribution q_i as sent on the wire: token ids and their probabilities.

    A quantised q (Quantize-Sample-Verify, `sampling.quantise`) also holds its integer
    counts, summing to sampling.Q_TOTAL, and probs = counts / Q_TOTAL (float64): what
    the draft sampled from and what both the coordinator and the target use."""

    token_ids: torch.Tensor  # int64 [n]
    probs: torch.Tensor  # float [n]
    counts: torch.Tensor | None = None  # int64 [n]; None for the float wire form

    def prob_of(self, token: int) -> float:
        hit = (self.token_ids == token).nonzero()
        return float(self.probs[hit[0, 0]]) if len(hit) else 0.0

    @staticmethod
    def quantised(token_ids: torch.Tensor, counts: torch.Tensor) -> SparseQ:
        return SparseQ(token_ids, counts.double() / Q_TOTAL, counts)

    @staticmethod
    def one_hot(token: int) -> SparseQ:
        return SparseQ.quantised(torch.tensor([token]), torch.tensor([Q_TOTAL]))


@dataclass(frozen=True)
class TargetRound:
    """What the target returns for one Verify of K drafts."""

    target_probs: list[float]  # p_i(x_i), i = 1..K
    recovered_tokens: list[int]  # a sample of norm(max(0, p_i - q_i)), i = 1..K
    bonus_token: int  # a sample of p_{K+1}
    # The target's forward pass that computed it: sessions, tokens, seconds (0 = unknown).
    pass_sessions: int = 0
    pass_tokens: int = 0
    pass_seconds: float = 0.0
    # Asked for (VerifyRequest.logprobs): specdec.logprobs.TokenLogprobs per position,
    # [x_i, recovered_i] then [bonus]; and those of the fed committed tokens.
    logprobs: list | None = None
    prompt_logprobs: list | None = None


@dataclass(frozen=True)
class Decision:
    """The tokens a round emits, with their kinds; num_accepted of them are drafts."""

    tokens: list[int]
    kinds: list[TokenKind]
    num_accepted: int


def residual(p: torch.Tensor, q: SparseQ) -> torch.Tensor:
    """norm(max(0, p - q)) for a dense p [V] and a sparse q.

    When p <= q everywhere (then p == q), rejection has probability 0 and the residual
    is undefined; p itself is returned so that callers always get a distribution.
    """
    r = (p - densify(q.token_ids, q.probs, p.shape[-1])).clamp_(min=0.0)
    total = r.sum()
    return r / total if total > 0 else p


def target_round(
    p: torch.Tensor,
    draft_tokens: Sequence[int],
    draft_q: Sequence[SparseQ] | None,
    generator: torch.Generator,
) -> TargetRound:
    """The target's share of a round.

    p: processed target distributions [K+1, V] at the K draft positions and the one
    after them. draft_q: the draft's q_i, or None for greedy (q_i is then one-hot at
    x_i). Draws, in order, recovered_1..recovered_K then the bonus from `generator`.
    """
    k = len(draft_tokens)
    assert p.shape[0] == k + 1, f"need K+1 = {k + 1} target rows, got {p.shape[0]}"
    target_probs = [float(p[i, x]) for i, x in enumerate(draft_tokens)]
    qs = draft_q if draft_q is not None else [SparseQ.one_hot(x) for x in draft_tokens]
    recovered = [sample(residual(p[i], qs[i]), generator) for i in range(k)]
    bonus = sample(p[k], generator)
    return TargetRound(target_probs, recovered, bonus)


def greedy_round(logits: torch.Tensor, draft_tokens: Sequence[int]) -> TargetRound:
    """`target_round` for greedy sampling, from the raw logits [K+1, V].

    p and q are one-hot, so p_i(x_i) is 1 exactly when x_i is the target's argmax, every
    residual is p itself and every draw is the argmax: the same result as target_round
    on process_logits(logits, greedy), with no vocabulary-sized work beyond one argmax
    (it matters when a target verifies a whole batch of sessions per pass).
    """
    top = argmax(logits)
    k = len(draft_tokens)
    return TargetRound([1.0 if top[i] == x else 0.0 for i, x in enumerate(draft_tokens)],
                       top[:k], top[k])


def argmax(logits: torch.Tensor) -> list[int]:
    """Row-wise argmax of [n, V] float logits (numpy's is several times faster on CPU;
    ties go to the lowest index, as torch's)."""
    return logits.float().numpy().argmax(-1).tolist()


def decide(
    draft_tokens: Sequence[int],
    draft_probs: Sequence[float],
    target: TargetRound,
    uniforms: Sequence[float],
) -> Decision:
    """The coordinator's accept/recover/bonus decision for one round.

    draft_probs[i] = q_i(x_i) > 0 (1.0 for greedy); uniforms[i] in [0, 1).
    Accepts x_i while u_i < min(1, p_i(x_i) / q_i(x_i)), i.e. u_i * q_i(x_i) < p_i(x_i).
    """
    tokens: list[int] = []
    for i, x in enumerate(draft_tokens):
        if uniforms[i] * draft_probs[i] < target.target_probs[i]:
            tokens.append(x)
            continue
        kinds = [TokenKind.ACCEPTED] * i + [TokenKind.RECOVERED]
        return Decision(tokens + [target.recovered_tokens[i]], kinds, i)
    k = len(draft_tokens)
    return Decision(tokens + [target.bonus_token], [TokenKind.ACCEPTED] * k + [TokenKind.BONUS], k)
