"""specdec.penalties against the formulas written out token by token, and the range
checks of the parameters."""

from __future__ import annotations

import pytest
import torch

from specdec import wire
from specdec.errors import InvalidArgument
from specdec.penalties import penalise
from specdec.sampling import SamplingParams, process_logits


def naive(logits: torch.Tensor, params: SamplingParams, seq: list[int]) -> torch.Tensor:
    """One row, after `seq`: bias, then HF's repetition penalty over the prompt and the
    output, then OpenAI's presence/frequency penalties over the output."""
    out = logits.clone()
    for t, b in params.logit_bias:
        out[t] += b
    r = params.repetition_penalty
    for t in set(seq):
        out[t] = out[t] / r if out[t] > 0 else out[t] * r
    generated = seq[params.prompt_len:]
    for t in set(generated):
        out[t] -= generated.count(t) * params.frequency_penalty + params.presence_penalty
    return out


@pytest.mark.parametrize("params", [
    SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, prompt_len=4),
    SamplingParams(repetition_penalty=1.3, prompt_len=4),
    SamplingParams(repetition_penalty=0.7, prompt_len=2),
    SamplingParams(logit_bias=((3, 5.0), (49, -100.0))),
    SamplingParams(presence_penalty=-1.0, frequency_penalty=2.0, repetition_penalty=1.3,
                   logit_bias=((3, 5.0),), prompt_len=4),
], ids=["openai", "repetition", "repetition-below-1", "bias", "all"])
def test_each_row_counts_the_drafts_before_it(params):
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    context, drafts = [1, 2, 3, 4, 5, 5, 6], [7, 5]
    out = penalise(logits, params, context, drafts)
    for r in range(3):
        assert torch.allclose(out[r], naive(logits[r], params, context + drafts[:r]))


def test_no_processor_leaves_the_logits_alone():
    logits = torch.randn(2, 10)
    assert penalise(logits, SamplingParams(temperature=0.5, min_p=0.2), [1, 2], [3]) is logits


def test_min_p_keeps_tokens_within_its_ratio_of_the_best():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = process_logits(logits, SamplingParams(temperature=1.0, min_p=0.35))
    assert (p > 0).tolist() == [True, True, False, False]
    assert torch.allclose(p[:2], torch.tensor([0.625, 0.375]))


@pytest.mark.parametrize(("params", "field"), [
    (SamplingParams(presence_penalty=2.5), "sampling.presence_penalty"),
    (SamplingParams(frequency_penalty=-2.01), "sampling.frequency_penalty"),
    (SamplingParams(repetition_penalty=0.0), "sampling.repetition_penalty"),
    (SamplingParams(repetition_penalty=3.0), "sampling.repetition_penalty"),
    (SamplingParams(min_p=1.5), "sampling.min_p"),
    (SamplingParams(logit_bias=((4, 101.0),)), "sampling.logit_bias[4]"),
    (SamplingParams(logit_bias=((-1, 1.0),)), "sampling.logit_bias:"),
])
def test_out_of_range_values_name_their_field(params, field):
    with pytest.raises(InvalidArgument) as e:
        params.validate()
    assert e.value.message.startswith(field)


def test_the_wire_carries_every_parameter():
    params = SamplingParams(0.75, 5, 0.875, 11, 0.5, -0.25, 1.5, 0.125, ((2, -3.0), (9, 4.0)), 6,
                            min_tokens=3, stop_token_ids=(7, 8))
    assert wire.sampling_from_proto(wire.sampling_to_proto(params)) == params
    assert wire.sampling_from_proto(wire.sampling_to_proto(SamplingParams())) == \
        SamplingParams()  # repetition 1 (off) travels as unset


def test_min_tokens_holds_back_the_stop_ids_until_enough_were_generated():
    """vLLM's min_tokens: a row whose generated count (context past prompt_len, then the
    drafts before it) is below min_tokens gets -inf at the stop ids, later rows do not;
    the draft and the target apply the same rows, so speculation stays lossless."""
    params = SamplingParams(prompt_len=3, min_tokens=4, stop_token_ids=(5, 9))
    logits = torch.randn(5, 12)
    out = penalise(logits, params, [1, 2, 3, 4], drafts=[6, 6, 6, 6])  # 1 generated
    assert torch.isinf(out[:3, [5, 9]]).all() and (out[:3, [5, 9]] < 0).all()
    assert torch.equal(out[3:], logits[3:])  # rows 3, 4 follow 4 and 5 generated tokens
    assert torch.equal(out[:3, :5], logits[:3, :5])  # other ids untouched
    done = penalise(logits, params, [1, 2, 3, 4, 4, 4, 4])  # 4 generated already
    assert torch.equal(done, logits)
    assert process_logits(out[:1], SamplingParams())[0, [5, 9]].sum() == 0  # never argmax
