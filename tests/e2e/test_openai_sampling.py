"""Every sampling parameter through the official `openai` package with speculation on:
penalties, logit_bias, min_p and repetition_penalty (greedy output equal to target-only,
drafted tokens in usage), logprobs on both APIs (equal with and without speculation),
echo with prompt logprobs and max_tokens 0, n choices and a batch of prompts."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Write a list of animals and their colours."}]
PROMPT = "The list of animals: cat, dog, cat, bird, dog,"
PARAMS = {
    "presence": dict(presence_penalty=1.5),
    "frequency": dict(frequency_penalty=1.0),
    "logit_bias": dict(logit_bias={"300": 4.0, "17": -100}),
    "repetition+min_p": dict(extra_body={"repetition_penalty": 1.5, "min_p": 0.2}),
    "all": dict(presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"42": 2},
                extra_body={"repetition_penalty": 1.2, "min_p": 0.05}),
}


def _k(params: dict, k: int) -> dict:
    return {**params, "extra_body": {**params.get("extra_body", {}), "num_draft_tokens": k}}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_each_parameter_keeps_greedy_output_and_speculation(client, model, name):
    params = PARAMS[name]
    for api in ("chat", "completions"):
        def run(k, extra=None, api=api):
            if api == "chat":
                out = client.chat.completions.create(
                    model=model, messages=MESSAGES, max_tokens=24, temperature=0,
                    **_k(extra if extra is not None else params, k))
                return out.choices[0].message.content, out.usage
            out = client.completions.create(model=model, prompt=PROMPT, max_tokens=24,
                                            temperature=0,
                                            **_k(extra if extra is not None else params, k))
            return out.choices[0].text, out.usage

        spec, usage = run(4)
        target_only, _ = run(0)
        assert spec == target_only, (api, name)
        assert usage.model_extra["specdec"]["drafted_tokens"] > 0  # speculation stayed on
        if name != "repetition+min_p":
            assert spec != run(0, {})[0]  # the parameter changed the output


def test_ignore_eos_and_min_tokens_as_vllm_keep_greedy_output(client, model):
    """vLLM's ignore_eos and min_tokens (what guidellm sends), with a logit_bias that makes
    the end token the argmax: alone it ends at once; ignore_eos runs to max_tokens;
    min_tokens holds the end back for that many tokens. Speculation stays on and greedy
    output equals target-only output."""
    from specdec.runtime.models import TINY_VOCAB
    from specdec.runtime.tiny_tokenizer import build

    eos = build(TINY_VOCAB).eos_token_id

    def run(k, **extra):
        out = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=12, temperature=0,
            logit_bias={str(eos): 100}, extra_body={"num_draft_tokens": k, **extra})
        return out.choices[0].finish_reason, out.usage.completion_tokens, out.usage

    assert run(4)[:2] == ("stop", 1)
    for extra, expected in ((dict(ignore_eos=True), ("length", 12)),
                            (dict(min_tokens=5), ("stop", 6))):
        spec, target_only = run(4, **extra), run(0, **extra)
        assert spec[:2] == target_only[:2] == expected, extra
        assert spec[2].model_extra["specdec"]["drafted_tokens"] > 0


def _chat_logprobs(client, model, k, stream=False):
    kwargs = dict(model=model, messages=MESSAGES, max_tokens=16, temperature=0,
                  logprobs=True, top_logprobs=3, extra_body={"num_draft_tokens": k})
    if not stream:
        out = client.chat.completions.create(**kwargs)
        return out.choices[0].message.content, out.choices[0].logprobs.content, out.usage
    text, entries = "", []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            entries += chunk.choices[0].logprobs.content if chunk.choices[0].logprobs else []
    return text, entries, None


def test_chat_logprobs_equal_with_and_without_speculation(client, model):
    text, spec, usage = _chat_logprobs(client, model, 4)
    base_text, base, _ = _chat_logprobs(client, model, 0)
    streamed_text, streamed, _ = _chat_logprobs(client, model, 4, stream=True)
    assert text == base_text == streamed_text
    assert len(spec) == len(base) == len(streamed) == usage.completion_tokens
    assert usage.model_extra["specdec"]["drafted_tokens"] > 0
    for a, b, c in zip(spec, base, streamed, strict=True):
        assert a.token == b.token == c.token
        assert abs(a.logprob - b.logprob) < 1e-3 and abs(a.logprob - c.logprob) < 1e-3
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
        assert len(a.top_logprobs) == 3 and a.logprob <= 0.0
        assert a.logprob == pytest.approx(a.top_logprobs[0].logprob)  # greedy: the best


def test_completions_logprobs_and_echo_in_the_legacy_shape(client, model):
    ids = client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True,
                                    logprobs=2)
    (choice,) = ids.choices
    lp = choice.logprobs
    assert choice.text == PROMPT  # max_tokens 0: the prompt, scored
    n = ids.usage.prompt_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0.0 for v in lp.token_logprobs[1:])
    assert all(len(t) <= 2 for t in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # lm-evaluation-harness's log-likelihood request: token ids, echo, one more token
    prompt_ids = [[5, 77, 301, 12, 9, 44]]
    runs = {k: client.completions.create(
        model=model, prompt=prompt_ids, max_tokens=1, echo=True, logprobs=1,
        temperature=0, extra_body={"num_draft_tokens": k}) for k in (0, 4)}
    for out in runs.values():
        assert len(out.choices[0].logprobs.token_logprobs) == len(prompt_ids[0]) + 1
    a, b = (runs[k].choices[0].logprobs for k in (0, 4))
    assert a.tokens == b.tokens
    assert all(abs(x - y) < 1e-3 for x, y in zip(a.token_logprobs[1:], b.token_logprobs[1:],
                                                  strict=True))


def test_n_choices_and_a_batch_of_prompts(client, model):
    out = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8,
                                         temperature=1.0, seed=7, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.message.content for c in out.choices]
    assert len(set(texts)) > 1  # each choice draws from its own seed stream
    single = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8,
                                            temperature=1.0, seed=7)
    assert out.usage.completion_tokens == 24
    assert out.usage.prompt_tokens == single.usage.prompt_tokens  # one prompt
    # streamed (greedy, so comparable with a unary run): each chunk names its choice
    greedy = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8,
                                            temperature=0)
    seen, done = {}, set()
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES,
                                                max_tokens=8, temperature=0, n=3,
                                                stream=True,
                                                stream_options={"include_usage": True}):
        for c in chunk.choices:
            seen[c.index] = seen.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                done.add(c.index)
        if chunk.usage:
            assert chunk.usage.completion_tokens == 24
    assert done == {0, 1, 2}
    assert [seen[i] for i in range(3)] == [greedy.choices[0].message.content] * 3
    batch = client.completions.create(model=model, prompt=["one two", "three four"],
                                      max_tokens=4, temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    alone = client.completions.create(model=model, prompt="three four", max_tokens=4,
                                      temperature=0)
    assert batch.choices[2].text == batch.choices[3].text == alone.choices[0].text


@pytest.mark.parametrize(("kwargs", "param"), [
    (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    (dict(n=0), "n"),
    (dict(n=9), "n"),
    (dict(logit_bias={"word": 1}), "logit_bias"),
    (dict(logit_bias={"5": -101}), "logit_bias"),
    (dict(presence_penalty=2.1), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(extra_body={"min_tokens": -1}), "min_tokens"),
    (dict(extra_body={"ignore_eos": "yes"}), "ignore_eos"),
])
def test_bad_values_are_400_naming_the_parameter(client, model, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4,
                                       **kwargs)
    assert info.value.param == param, info.value.message
    assert client.chat.completions.create(model=model, messages=MESSAGES,
                                          max_tokens=2).choices  # still serving
