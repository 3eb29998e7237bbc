"""Log-probabilities a client asked for, from the raw model.

They are the log-softmax of the target model's logits, before temperature, penalties,
bias or truncation (vLLM's default, "raw" log-probabilities): what the model thinks of
a token, the same whatever the request's sampling, so speculative and target-only runs
report the same numbers, and a greedy request's are not all 0 and -inf. The target
computes them beside a Verify (VerifyRequest.logprobs): at each of its K+1 positions
for the tokens the round may emit there, so whichever the coordinator keeps (an
accepted draft, the recovered token, the bonus) has its value with no second call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdec.messages import message_fields, message_from
from specdec.v1 import common_pb2

if TYPE_CHECKING:
    import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's cap on top_logprobs


@dataclass(frozen=True)
class TokenLogprobs:
    """One position: the log-probabilities of the tokens asked about, and of the
    position's `top` most likely tokens, most likely first."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()

    def of(self, token: int) -> TokenLogprobs:
        """This position narrowed to one of its asked tokens."""
        i = self.token_ids.index(token)
        return TokenLogprobs((token,), (self.logprobs[i],), self.top_ids, self.top_logprobs)


def logprobs_of(logits: torch.Tensor, asked: Sequence[Sequence[int]],
                top: int) -> list[TokenLogprobs]:
    """Per row of logits [R, V]: the log-probabilities of asked[r]'s tokens and of the
    row's `top` most likely tokens."""
    import torch  # lazily: the client reads TokenLogprobs without torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    if top > 0:
        top_values, top_ids = torch.topk(logp, top, dim=-1)
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    out = []
    for r, tokens in enumerate(asked):
        values = logp[r, list(tokens)].tolist() if tokens else []
        out.append(TokenLogprobs(tuple(tokens), tuple(values),
                                 tuple(top_ids[r]) if top > 0 else (),
                                 tuple(top_values[r]) if top > 0 else ()))
    return out


def logprobs_to_proto(entry: TokenLogprobs) -> common_pb2.TokenLogprobs:
    return message_from(common_pb2.TokenLogprobs, entry)


def logprobs_from_proto(msg: common_pb2.TokenLogprobs) -> TokenLogprobs:
    return TokenLogprobs(**message_fields(msg))
