"""Contrastive decoding computed in one process from the two models' logits: the
reference that the services' output must equal token for token (greedy) and whose
distribution their sampled output must follow.

Deliberately simple: every step runs both Hugging Face models over the whole sequence
(no KV cache, no batching, nothing shared with specdec's runtime), so that a bug in the
services cannot also be in the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.contrastive import ContrastiveParams, contrastive_distribution, greedy_token


@torch.no_grad()
def last_logits(model, ids: Sequence[int]) -> torch.Tensor:
    """The model's logits for the token after `ids` (float32 [vocab])."""
    out = model(input_ids=torch.tensor([list(ids)]), use_cache=False)
    return out.logits[0, -1].float()


@torch.no_grad()
def decode(expert, amateur, prompt_ids: Sequence[int], max_new_tokens: int,
           params: ContrastiveParams, temperature: float = 0.0,
           generator: torch.Generator | None = None) -> list[int]:
    """`max_new_tokens` contrastive tokens after `prompt_ids`: the score's argmax at
    temperature 0, else draws from softmax(score / temperature) with `generator`."""
    params.validate()
    ids, out = list(prompt_ids), []
    for _ in range(max_new_tokens):
        e, a = last_logits(expert, ids), last_logits(amateur, ids)
        if temperature <= 0.0:
            token = greedy_token(e, a, params)
        else:
            p = contrastive_distribution(e, a, params, temperature)
            token = int(torch.multinomial(p, 1, generator=generator))
        ids.append(token)
        out.append(token)
    return out
