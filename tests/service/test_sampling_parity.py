"""Every sampling parameter with speculation on, over the real services: penalties,
logit bias and min-p keep greedy output equal to target-only output and to an
in-process transformers reference applying the formulas; sampled output follows the
penalised target distribution (chi-square); log-probabilities agree with the reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.penalties import penalise
from specdec.sampling import SamplingParams
from tests.service.test_sampled_distribution import (
    chi_square_p_value,
    sample_outputs,
    target_joint,
)

PROMPT = [31, 415, 92, 65, 31, 7]
N = 40
CASES = {
    "presence": SamplingParams(presence_penalty=1.5),
    "frequency": SamplingParams(frequency_penalty=0.8),
    "repetition": SamplingParams(repetition_penalty=1.8),
    "logit_bias": SamplingParams(logit_bias=((5, 3.0), (17, -100.0), (415, 2.5))),
    "min_p": SamplingParams(min_p=0.3),
    "all": SamplingParams(presence_penalty=-0.5, frequency_penalty=1.2,
                          repetition_penalty=1.3, min_p=0.1, logit_bias=((9, 1.5),)),
}


def with_prompt(params: SamplingParams, prompt: list[int]) -> SamplingParams:
    return replace(params, prompt_len=len(prompt))  # what the coordinator's API sets


def reference_greedy(model, prompt: list[int], params: SamplingParams, n: int):
    """transformers, fp32, no cache: each step's logits from the whole sequence, then the
    formulas written out here (OpenAI's presence/frequency, HF's repetition penalty).
    Returns the tokens and each step's margin between the two best logits."""
    seq, out, margins = list(prompt), [], []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0, -1].float()
        bias = dict(params.logit_bias)
        for t, b in bias.items():
            logits[t] += b
        if params.repetition_penalty != 1.0:
            for t in set(seq):
                r = params.repetition_penalty
                logits[t] = logits[t] / r if logits[t] > 0 else logits[t] * r
        generated = seq[len(prompt):]
        for t in set(generated):
            logits[t] -= (generated.count(t) * params.frequency_penalty
                          + params.presence_penalty)
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        token = int(logits.argmax())
        out.append(token)
        seq.append(token)
    return out, margins


@pytest.fixture()
def loop(draft_client, target_client):
    return SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_with_parameter_equals_target_only_and_reference(loop, target_server, name):
    params = with_prompt(CASES[name], PROMPT)
    plain = loop.generate(PROMPT, N, with_prompt(SamplingParams(), PROMPT), 0).token_ids
    baseline = loop.generate(PROMPT, N, params, num_draft_tokens=0)
    result = loop.generate(PROMPT, N, params, num_draft_tokens=4)
    assert result.token_ids == baseline.token_ids
    assert result.stats.drafted_tokens > 0 and result.stats.accepted_tokens > 0
    if name != "min_p":  # min-p never moves the argmax; every other one does here
        assert baseline.token_ids != plain
    model = target_server[1].model.backend.loaded.model
    expected, margins = reference_greedy(model, PROMPT, params, N)
    tie = next((i for i, m in enumerate(margins) if m < 1e-4), N)  # a near-tie
    assert result.token_ids[:tie + 1] == expected[:tie + 1]


def test_penalties_count_the_drafts_before_each_position(loop):
    """A frequency penalty strong enough to forbid a repeat within the round: the
    drafts the target verifies must be penalised by the drafts before them."""
    params = with_prompt(SamplingParams(frequency_penalty=2.0, presence_penalty=2.0),
                         PROMPT)
    for k in (2, 8):
        result = loop.generate(PROMPT, 24, params, num_draft_tokens=k)
        assert result.token_ids == loop.generate(PROMPT, 24, params, 0).token_ids


@pytest.mark.slow
def test_sampled_with_penalties_follows_the_penalised_target(draft_client, target_client,
                                                             target_server):
    prompt = PROMPT[:4]
    params = with_prompt(SamplingParams(temperature=1.0, top_k=6, presence_penalty=1.0,
                                        frequency_penalty=0.7, repetition_penalty=1.2,
                                        min_p=0.05, logit_bias=((31, 1.0),)), prompt)
    expected = target_joint(target_server[1].model.backend, params, prompt=prompt,
                            transform=lambda logits, context: penalise(logits, params, context))
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False))
    trials = 1500
    counts, accepted, drafted = sample_outputs(loop, prompt, params, trials, 2)
    assert 0 < accepted < drafted
    p_value = chi_square_p_value(counts, expected, trials)
    assert p_value > 1e-3, (p_value, counts.most_common(8))


def _logprob_run(loop, prompt, params, k, top):
    tokens, entries, prompt_entries = [], [], None
    for out in loop.rounds(prompt, 24, params, k, logprobs=top, prompt_logprobs=True):
        tokens += out.tokens
        entries += out.logprobs
        if out.prompt_logprobs is not None:
            prompt_entries = out.prompt_logprobs
    return tokens, entries, prompt_entries


def _check_against_reference(model, prompt, tokens, entries, prompt_entries, top):
    """Each entry within 5e-3 of transformers' fp32 log-softmax over the same text."""
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].double(), -1)
    for i, e in enumerate(entries):  # output token i, predicted at row len(prompt)+i-1
        row = ref[len(prompt) + i - 1]
        assert e.token_ids == (tokens[i],)
        assert abs(e.logprobs[0] - float(row[tokens[i]])) < 5e-3
        assert list(e.top_ids) == torch.topk(row, top).indices.tolist()
        assert max(abs(a - float(row[t])) for a, t in zip(e.top_logprobs, e.top_ids,
                                                           strict=True)) < 5e-3
    assert [e.token_ids[0] for e in prompt_entries] == prompt[1:]
    for i, e in enumerate(prompt_entries):  # prompt token i + 1
        assert abs(e.logprobs[0] - float(ref[i, prompt[i + 1]])) < 5e-3


@pytest.mark.parametrize("name", ["greedy", "sampled", "penalised"])
def test_logprobs_agree_with_target_only_and_the_reference(loop, target_server, name):
    params = with_prompt({"greedy": SamplingParams(),
                          "sampled": SamplingParams(temperature=0.9, seed=3),
                          "penalised": SamplingParams(frequency_penalty=1.0)}[name], PROMPT)
    spec = _logprob_run(loop, PROMPT, params, 4, 3)
    base = _logprob_run(loop, PROMPT, params, 0, 3)
    if name != "sampled":  # a sampled run's own draws differ with K; greedy ones do not
        assert spec[0] == base[0]
    same = next((i for i, (a, b) in enumerate(zip(spec[0], base[0], strict=False))
                 if a != b),
                min(len(spec[0]), len(base[0])))
    pairs = list(zip(spec[1][:same] + spec[2], base[1][:same] + base[2], strict=True))
    assert len(pairs) >= len(PROMPT) + 1
    for e, b in pairs:
        assert e.token_ids == b.token_ids and e.top_ids == b.top_ids
        assert max(abs(x - y) for x, y in zip(e.logprobs + e.top_logprobs,
                                              b.logprobs + b.top_logprobs,
                                              strict=True)) < 1e-3
    model = target_server[1].model.backend.loaded.model
    for tokens, entries, prompt_entries in (spec, base):
        assert len(entries) == len(tokens) and len(prompt_entries) == len(PROMPT) - 1
        _check_against_reference(model, PROMPT, tokens, entries, prompt_entries, 3)


def test_prompt_logprobs_over_chunked_prefill(loop, target_server, monkeypatch):
    """A prompt fed over several partial Verifies is still scored at every position."""
    import coordinator.loop.generation as generation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 4)
    prompt = [3 + (i * 37) % 500 for i in range(11)]
    params = with_prompt(SamplingParams(), prompt)
    rounds = list(loop.rounds(prompt, 0, params, 4, logprobs=0, prompt_logprobs=True))
    assert [out.tokens for out in rounds] == [[]]
    model = target_server[1].model.backend.loaded.model
    _check_against_reference(model, prompt, [], [], rounds[0].prompt_logprobs, 0)
    # and with tokens to generate after it
    tokens, entries, scored = _logprob_run(loop, prompt, params, 4, 2)
    _check_against_reference(model, prompt, tokens, entries, scored, 2)


def test_the_loop_tells_the_services_where_the_prompt_ends(loop):
    """Penalties count generated tokens only; the generation sets prompt_len itself, so
    a caller of the loop need not (the API layer does not)."""
    params = SamplingParams(presence_penalty=2.0, frequency_penalty=1.0)
    assert loop.generate(PROMPT, 24, params, 4).token_ids == \
        loop.generate(PROMPT, 24, with_prompt(params, PROMPT), 0).token_ids
