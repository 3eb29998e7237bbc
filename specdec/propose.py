"""What a Propose asks of the draft besides the cache sync and the sampling parameters:
one typed object from the coordinator's drafters to the draft engine (whose ProposeArgs
extends it), converted to and from the wire in one place (specdec.wire), field by field
by name. A new draft option is a field here, one in ProposeRequest (protos/), and the
code that sets it and the code that reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class ProposeOptions:
    num_tokens: int = 1  # K: tokens to draft (a pipelined round's guess at the bonus included)
    top_n: int = 0  # sparse q size per drafted token; 0 = the engine's default
    top_mass: float = 0.0  # q keeps its most likely tokens up to this mass; 0 = the default
    exit_below: float = 0.0  # confidence exit: stop after a token drawn with prob < this
    keep_logits: bool = False  # keep each step's logits for a later Score (contrastive)
    min_p: float = 0.0  # propose only tokens with q >= min_p * max q (0 = off)
    guess_seed: int | None = None  # sampled: the first token by coupled Gumbel-max
    guess_last: bool = False  # ... the last token instead (a speculative round's guess)
    lead_seed: int | None = None  # sampled: the first token by coupled Gumbel-max
