"""Teacher-forced agreement of a skip set with the target's own text.

One forward pass of the model minus the set over prompt + generated text gives, at every
generated position, the draft's greedy prediction from the true prefix; flag i is True
when it equals generated token i. specdec_tools.skip_tune.cost turns the flags into rounds.
"""

from __future__ import annotations

import torch

from specdec.runtime.layer_skip import SkipSet, skipped
from specdec_tools.skip_tune.calibration import Sequence


@torch.inference_mode()
def flags(model, sequence: Sequence, skip: SkipSet = ()) -> list[bool]:
    """Per generated token: does the model without `skip` predict it from the prefix?"""
    n = len(sequence.generated)
    if n == 0:
        return []
    ids = torch.tensor([sequence.ids], dtype=torch.long)
    with skipped(model, skip):
        # positions P-1 .. P+n-2 predict generated tokens 0 .. n-1
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=n + 1).logits[0, :-1]
    predicted = logits.argmax(-1).tolist()
    return [p == t for p, t in zip(predicted, sequence.generated, strict=True)]
