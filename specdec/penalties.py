"""The logits processors that depend on the text so far: logit bias, the repetition
penalty, and OpenAI's presence and frequency penalties. One copy, used by the target at
every position it verifies and by the draft on each step's q (specdec.sampling).

A penalised distribution is just the target distribution speculation must preserve. A
position's penalty counts every token before it, the drafts before it included, so the
target applies it row by row over a Verify's K+1 positions (`penalise`'s `drafts`):
accepted drafts then meet exactly the distribution target-only decoding would have used
at their place. The draft applying the same transform to q only raises acceptance.

Applied on the raw logits, in this order (vLLM's: bias, then penalties):
  logit_bias            logit[j] += bias[j]
  repetition_penalty    (HF transformers' RepetitionPenaltyLogitsProcessor, vLLM's) for
                        every token seen in the prompt or the output: logit / r when the
                        logit is > 0, logit * r otherwise
  presence, frequency   (OpenAI's formula) logit[j] -= c[j] * frequency + (c[j] > 0) *
                        presence, c[j] the count of token j among the generated tokens
  min_tokens            (vLLM's) logit[j] = -inf for j in stop_token_ids while fewer than
                        min_tokens tokens were generated before the row
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.sampling import SamplingParams


def penalise(logits: torch.Tensor, params: SamplingParams, context: Sequence[int],
             drafts: Sequence[int] = ()) -> torch.Tensor:
    """The processed logits [R, V] (float32) of R positions: row r follows `context`
    then drafts[:r] (so R <= len(drafts) + 1). `context` is the whole sequence before
    row 0, prompt first (its first params.prompt_len tokens). The input itself when no
    processor is on."""
    if not params.penalised:
        return logits
    out = logits.float().clone()
    rows, vocab = out.shape
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
        bias = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32)
        keep = ids < vocab  # a padded head may be wider than the vocabulary, not narrower
        out[:, ids[keep]] += bias[keep]
    if params.min_tokens and params.stop_token_ids:
        # vLLM's min_tokens: rows before the min_tokens-th generated token cannot end
        short = min(rows, params.min_tokens - (len(context) - params.prompt_len))
        if short > 0:
            ids = torch.tensor(params.stop_token_ids, dtype=torch.long)
            out[:short, ids[ids < vocab]] = float("-inf")
    if params.repetition_penalty == 1.0 and not (params.presence_penalty
                                                 or params.frequency_penalty):
        return out
    # Only the tokens seen so far are touched: work on those columns alone ([R, U], U
    # the distinct tokens of the context and the drafts), not on the whole vocabulary.
    history, later = list(context), list(drafts[:rows - 1])
    seen_ids = sorted(set(history) | set(later))
    column = {t: i for i, t in enumerate(seen_ids)}
    ids = torch.tensor(seen_ids, dtype=torch.long)
    # counts[r]: the generated tokens before row r (the drafts are all generated)
    generated = torch.tensor([column[t] for t in history[params.prompt_len:]],
                             dtype=torch.long)
    counts = torch.bincount(generated, minlength=len(seen_ids)).float() \
        .expand(rows, -1).clone()
    for r, t in enumerate(later, start=1):
        counts[r:, column[t]] += 1.0
    sub = out[:, ids]
    if params.repetition_penalty != 1.0:
        seen = counts > 0
        prompt = sorted({column[t] for t in history[:params.prompt_len]})
        if prompt:
            seen[:, prompt] = True
        penalty = params.repetition_penalty
        sub = torch.where(seen, torch.where(sub > 0, sub / penalty, sub * penalty), sub)
    if params.frequency_penalty or params.presence_penalty:
        sub = sub - (counts * params.frequency_penalty
                     + (counts > 0) * params.presence_penalty)
    out[:, ids] = sub
    return out
