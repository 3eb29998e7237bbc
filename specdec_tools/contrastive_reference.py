"""Contrastive decoding computed in one process from the two models' logits: the
reference that the services' output must equal token for token (greedy) and whose
distribution their sampled output must follow.

Deliberately simple: every step runs both models over the whole sequence (no KV cache, no
batching, no sessions, no wire), so that a bug in the services' protocol cannot also be in
the reference. The models are Hugging Face ones (the tiny pair) or, for the real pair,
the services' own backends loaded in this process (an OpenVINO int8 amateur has no
Hugging Face twin), called through `backend()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.contrastive import ContrastiveParams, contrastive_distribution, greedy_token

Logits = Callable[[Sequence[int]], torch.Tensor]  # ids -> the next token's logits [vocab]


@torch.no_grad()
def last_logits(model, ids: Sequence[int]) -> torch.Tensor:
    """A Hugging Face model's logits for the token after `ids` (float32 [vocab])."""
    out = model(input_ids=torch.tensor([list(ids)]), use_cache=False)
    return out.logits[0, -1].float()


def hf(model) -> Logits:
    """A Hugging Face causal LM as a Logits function (the whole sequence every time)."""
    return lambda ids: last_logits(model, ids)


def backend(b) -> Logits:
    """A specdec runtime backend (torch or OpenVINO) as a Logits function: a fresh cache and
    one forward over the whole sequence every time, so no session, cache reuse, batching
    or wire is involved."""
    return lambda ids: b.forward(b.new_cache(), list(ids), keep_last=1)[0].float()


@torch.no_grad()
def decode(expert, amateur, prompt_ids: Sequence[int], max_new_tokens: int,
           params: ContrastiveParams, temperature: float = 0.0,
           generator: torch.Generator | None = None) -> list[int]:
    """`max_new_tokens` contrastive tokens after `prompt_ids`: the score's argmax at
    temperature 0, else draws from softmax(score / temperature) with `generator`.
    `expert` and `amateur` are Hugging Face models or Logits functions."""
    params.validate()
    expert, amateur = (m if _is_logits(m) else hf(m) for m in (expert, amateur))
    ids, out = list(prompt_ids), []
    for _ in range(max_new_tokens):
        e, a = expert(ids), amateur(ids)
        if temperature <= 0.0:
            token = greedy_token(e, a, params)
        else:
            p = contrastive_distribution(e, a, params, temperature)
            token = int(torch.multinomial(p, 1, generator=generator))
        ids.append(token)
        out.append(token)
    return out


def _is_logits(m) -> bool:
    return callable(m) and not isinstance(m, torch.nn.Module)
