"""OpenAI's Predicted Outputs through the official `openai` client: the output is the
same with or without a prediction; the prediction fields count prediction tokens only."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Rewrite this list, one item per line."}]


def chat(client, model, prediction=None, **kw):
    extra = {} if prediction is None else {"prediction": prediction}
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=40,
                                          temperature=0, **extra, **kw)


def test_predictions_speed_up_without_changing_the_output(client, model):
    plain = chat(client, model)
    answer = plain.choices[0].message.content
    d = plain.usage.completion_tokens_details
    assert d.accepted_prediction_tokens == d.rejected_prediction_tokens == 0
    exact = chat(client, model, {"type": "content", "content": answer})
    assert exact.choices[0].message.content == answer
    d, specdec = exact.usage.completion_tokens_details, exact.usage.model_extra["specdec"]
    # The tiny random model's text does not re-tokenize into the ids it came from (odd
    # byte tokens), so only some of it aligns, how much varies with the text; with the
    # ids themselves: tests/service/test_predicted_outputs; the real pair's share:
    # specdec bench-params (0.93)
    assert d.accepted_prediction_tokens > 0
    assert specdec["prediction_accepted_tokens"] == d.accepted_prediction_tokens
    assert d.accepted_prediction_tokens + d.rejected_prediction_tokens == \
        specdec["prediction_tokens"]
    edited = answer[:len(answer) // 3] + " and something else entirely " + \
        answer[len(answer) // 2:]
    parts = [{"type": "text", "text": edited[:10]}, {"type": "text", "text": edited[10:]}]
    changed = chat(client, model, {"type": "content", "content": parts})
    assert changed.choices[0].message.content == answer
    assert changed.usage.completion_tokens_details.rejected_prediction_tokens > 0
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(
        client, model, {"type": "content", "content": edited}, stream=True) if c.choices)
    assert streamed == answer


@pytest.mark.parametrize("prediction", [
    {"type": "text", "content": "x"}, {"content": "x"}, "just text",
    {"type": "content", "content": 5}, {"type": "content", "content": [{"type": "image"}]},
])
def test_a_prediction_that_is_not_content_is_400(client, model, prediction):
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, model, prediction)
    assert info.value.param == "prediction"
    assert chat(client, model).choices  # still serving
