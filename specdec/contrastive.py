"""The math of contrastive decoding, as pure functions over one position's logits.

Two models at one position: the *expert* (the target) and the *amateur* (the draft).

- Plausible set (Li et al. 2022, "Contrastive Decoding: Open-ended Text Generation as
  Optimization"): V_head = {x : p_exp(x) >= alpha * max_w p_exp(w)}, alpha in (0, 1].
  Every score below is -inf outside V_head, so a token the expert finds implausible is
  never chosen, however much less the amateur likes it.
- Li et al.'s score: log p_exp(x) - log p_ama(x) on V_head, where p_ama may be taken at
  its own temperature (`amateur_temperature`). Greedy is its argmax.
- O'Brien & Lewis 2023 ("Contrastive Decoding Improves Reasoning in Large Language
  Models"), in logit space: (1 + beta) * s_exp(x) - beta * s_ama(x) on the same V_head,
  beta >= 0 (0 = the expert alone, restricted to V_head). Sampling from the softmax of
  this score is the sampled mode; its argmax is the greedy one.

`contrastive_distribution` is the p a sampled contrastive step draws from, and what
speculative contrastive decoding (Yuan et al. 2023, "Speculative Contrastive Decoding")
hands to specdec.verify in place of the target's own p, so that accept/resample stays
lossless with respect to it.

The sparse forms (`head`, `head_scores`) are what crosses the wire: the expert's V_head
is usually a handful of ids, and the amateur is needed only there (docs/design.md,
section 17). They give the same result as the dense forms on V_head, exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.errors import InvalidArgument

LI, OBRIEN = "li", "obrien"  # the two formulations
DEFAULT_ALPHA = 0.1
DEFAULT_BETA = 0.5


@dataclass(frozen=True)
class ContrastiveParams:
    """alpha: plausibility cut, in (0, 1]. beta: amateur weight of the logit-space form
    (>= 0). amateur_temperature: the amateur's temperature in Li et al.'s form (> 0).
    formulation: "li" or "obrien"."""

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    amateur_temperature: float = 1.0
    formulation: str = OBRIEN

    def validate(self) -> ContrastiveParams:
        """Self, or InvalidArgument naming what is wrong and the allowed range."""
        if not (math.isfinite(self.alpha) and 0.0 < self.alpha <= 1.0):
            raise InvalidArgument(f"alpha must be in (0, 1] (the plausibility cut: keep "
                                  f"tokens with p >= alpha * max p), got {self.alpha}")
        if not (math.isfinite(self.beta) and self.beta >= 0.0):
            raise InvalidArgument(f"beta must be a finite number >= 0 (the amateur's "
                                  f"weight; 0 = the expert alone), got {self.beta}")
        if not (math.isfinite(self.amateur_temperature) and self.amateur_temperature > 0.0):
            raise InvalidArgument(f"amateur_temperature must be > 0, got "
                                  f"{self.amateur_temperature}")
        if self.formulation not in (LI, OBRIEN):
            raise InvalidArgument(f"formulation must be {LI!r} or {OBRIEN!r}, got "
                                  f"{self.formulation!r}")
        return self


def plausible_mask(expert_logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """V_head as a boolean mask over the vocabulary: p_exp(x) >= alpha * max p_exp. In log
    space, log p(x) >= log alpha + max log p (the softmax's normaliser cancels)."""
    return expert_logits >= expert_logits.max() + math.log(alpha)


def scores(expert_logits: torch.Tensor, amateur_logits: torch.Tensor,
           params: ContrastiveParams) -> torch.Tensor:
    """The contrastive score of every token (float32 [vocab]), -inf outside V_head."""
    expert_logits, amateur_logits = expert_logits.float(), amateur_logits.float()
    mask = plausible_mask(expert_logits, params.alpha)
    if params.formulation == LI:
        s = torch.log_softmax(expert_logits, -1) - torch.log_softmax(
            amateur_logits / params.amateur_temperature, -1)
    else:
        s = (1.0 + params.beta) * expert_logits - params.beta * amateur_logits
    return torch.where(mask, s, torch.full_like(s, -math.inf))


def contrastive_distribution(expert_logits: torch.Tensor, amateur_logits: torch.Tensor,
                             params: ContrastiveParams,
                             temperature: float = 1.0) -> torch.Tensor:
    """softmax(score / temperature): the distribution a sampled contrastive step draws
    from (zero outside V_head). temperature 0 gives the one-hot greedy choice."""
    s = scores(expert_logits, amateur_logits, params)
    if temperature <= 0.0:
        return torch.nn.functional.one_hot(s.argmax(), s.numel()).float()
    return torch.softmax(s / temperature, -1)


def greedy_token(expert_logits: torch.Tensor, amateur_logits: torch.Tensor,
                 params: ContrastiveParams) -> int:
    """argmax of the score (ties: the lowest id, as torch.argmax)."""
    return int(scores(expert_logits, amateur_logits, params).argmax())


# -- the sparse forms, as the wire carries them ------------------------------------------


@dataclass(frozen=True)
class Head:
    """The expert's side of one position: V_head's ids (ascending, so that an argmax over
    them breaks ties as torch.argmax over the vocabulary does: the lowest id) and, for
    each, what the score needs from the expert: its log-probability (Li et al.)
    or its logit (O'Brien & Lewis). Logits are shift-invariant in the softmax, and the
    logit-space score shifts by a constant too, so the expert's logits may be sent as
    logit - max logit."""

    token_ids: torch.Tensor  # int64 [h]
    values: torch.Tensor  # float32 [h]


def head(expert_logits: torch.Tensor, params: ContrastiveParams) -> Head:
    """V_head and the expert's values on it."""
    expert_logits = expert_logits.float()
    ids = plausible_mask(expert_logits, params.alpha).nonzero().flatten()
    if params.formulation == LI:
        values = torch.log_softmax(expert_logits, -1)[ids]
    else:
        values = expert_logits[ids] - expert_logits.max()
    return Head(ids, values)


def amateur_values(amateur_logits: torch.Tensor, token_ids: torch.Tensor,
                   params: ContrastiveParams) -> torch.Tensor:
    """What the score needs from the amateur on V_head's ids: log-probabilities at its
    temperature (Li et al.; the normaliser is over the whole vocabulary, so it must be
    computed where the amateur's full logits are) or logits relative to their maximum
    (O'Brien & Lewis)."""
    amateur_logits = amateur_logits.float()
    if params.formulation == LI:
        return torch.log_softmax(amateur_logits / params.amateur_temperature, -1)[token_ids]
    return amateur_logits[token_ids] - amateur_logits.max()


def head_scores(h: Head, amateur: torch.Tensor, params: ContrastiveParams) -> torch.Tensor:
    """The scores on V_head from the two sides' sparse values (float32 [h]). Equal to
    `scores(...)[h.token_ids]` up to a constant shift (O'Brien & Lewis), which neither the
    argmax nor the softmax sees."""
    if params.formulation == LI:
        return h.values - amateur
    return (1.0 + params.beta) * h.values - params.beta * amateur


def head_distribution(h: Head, amateur: torch.Tensor, params: ContrastiveParams,
                      temperature: float = 1.0) -> torch.Tensor:
    """contrastive_distribution on V_head's ids (float32 [h], summing to 1)."""
    s = head_scores(h, amateur, params)
    if temperature <= 0.0:
        return torch.nn.functional.one_hot(s.argmax(), s.numel()).float()
    return torch.softmax(s / temperature, -1)
