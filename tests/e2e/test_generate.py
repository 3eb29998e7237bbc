"""The client API through Ray Serve: exactness, streaming, stop strings, cancellation."""

from __future__ import annotations

from collections import Counter

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from scipy.stats import chisquare

from specdec.runtime import models
from specdec.sampling import SamplingParams, process_logits
from specdec.v1 import common_pb2, generate_pb2
from tests.e2e.conftest import sessions_released

pytestmark = pytest.mark.slow

CHAT = [generate_pb2.ChatMessage(role="user", content="Tell me about speculative decoding.")]


def req(**kw) -> generate_pb2.GenerateRequest:
    kw.setdefault("max_new_tokens", 48)
    return generate_pb2.GenerateRequest(**kw)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("prompt", [{"prompt": "The quick brown fox"}, {"messages": CHAT},
                                    {"prompt_token_ids": [5, 6, 7, 8]}],
                         ids=["text", "chat", "ids"])
def test_greedy_speculative_equals_target_only(generator_stub, prompt, k):
    base = generator_stub.Generate(req(num_draft_tokens=0, **prompt), timeout=60)
    spec = generator_stub.Generate(req(num_draft_tokens=k, **prompt), timeout=60)
    assert spec.token_ids == base.token_ids and spec.text == base.text
    assert len(spec.token_ids) == len(spec.kinds) == spec.stats.generated_tokens
    assert set(base.kinds) == {generate_pb2.TOKEN_KIND_TARGET}
    assert spec.stats.accepted_tokens == list(spec.kinds).count(generate_pb2.TOKEN_KIND_ACCEPTED)
    assert 0 < spec.stats.accepted_tokens <= spec.stats.drafted_tokens
    assert spec.finish_reason in ("length", "eos")


def test_stream_concatenates_to_unary(generator_stub):
    request = req(messages=CHAT, num_draft_tokens=4, max_new_tokens=64)
    unary = generator_stub.Generate(request, timeout=60)
    chunks = list(generator_stub.GenerateStream(request, timeout=60))
    assert len(chunks) > 1
    assert "".join(c.text for c in chunks) == unary.text
    assert [t for c in chunks for t in c.token_ids] == list(unary.token_ids)
    assert [c.finish_reason for c in chunks[:-1]] == [""] * (len(chunks) - 1)
    assert chunks[-1].finish_reason == unary.finish_reason
    assert chunks[-1].stats.generated_tokens == len(unary.token_ids)


def test_stop_string_cuts_text(generator_stub):
    base = generator_stub.Generate(req(prompt="Hello", num_draft_tokens=0, max_new_tokens=64),
                                   timeout=60)
    text = base.text
    assert len(text) > 20, text
    stop = text[12:15]
    cut = text.index(stop)
    for k in (0, 4):
        for call in (generator_stub.Generate, generator_stub.GenerateStream):
            out = call(req(prompt="Hello", num_draft_tokens=k, max_new_tokens=64, stop=[stop]),
                       timeout=60)
            if call is generator_stub.GenerateStream:
                chunks = list(out)
                got_text = "".join(c.text for c in chunks)
                reason = chunks[-1].finish_reason
            else:
                got_text, reason = out.text, out.finish_reason
            assert (got_text, reason) == (text[:cut], "stop"), (k, call)


def test_sampled_first_token_follows_target(generator_stub):
    prompt = [31, 415, 92, 65]
    params = SamplingParams(temperature=1.0, top_k=5)
    backend_model = models.load(models.TINY_TARGET).model
    with torch.no_grad():
        logits = backend_model(torch.tensor([prompt])).logits[0, -1]
    p = process_logits(logits, params)
    trials = 500
    counts = Counter()
    for seed in range(trials):
        sampling = common_pb2.SamplingParams(temperature=1.0, top_k=5, seed=seed)
        out = generator_stub.Generate(req(prompt_token_ids=prompt, num_draft_tokens=3,
                                          max_new_tokens=1, sampling=sampling), timeout=60)
        counts[out.token_ids[0]] += 1
    support = p.nonzero().flatten().tolist()
    assert set(counts) <= set(support)
    observed = [counts[t] for t in support]
    expected = [float(p[t]) * trials for t in support]
    assert chisquare(observed, expected).pvalue > 1e-3
    # Same seed, same text (through the whole distributed system).
    again = [generator_stub.Generate(req(prompt_token_ids=prompt, num_draft_tokens=3,
                                         max_new_tokens=24,
                                         sampling=common_pb2.SamplingParams(
                                             temperature=1.0, seed=77)), timeout=60).token_ids
             for _ in range(2)]
    assert again[0] == again[1]


def test_cancelled_stream_releases_sessions(generator_stub, coordinator):
    _, draft_engine, target_engine, _ = coordinator
    stream = generator_stub.GenerateStream(req(prompt="Once upon a time", num_draft_tokens=4,
                                               max_new_tokens=2000), timeout=60)
    first = next(stream)
    assert first.token_ids
    stream.cancel()
    assert sessions_released(draft_engine, target_engine), \
        (len(draft_engine.model.store), len(target_engine.model.store))


def test_health_on_the_coordinator_port(coordinator):
    with grpc.insecure_channel(coordinator[0]) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING


BAD_REQUESTS = [
    (req(), "exactly one of prompt"),
    (req(prompt="x", prompt_token_ids=[1]), "exactly one of prompt"),
    (req(prompt="x", max_new_tokens=0), "max_new_tokens"),
    (req(prompt="x", max_new_tokens=10**6), "max_new_tokens"),
    (req(prompt_token_ids=[1] * 3000), "context"),
    (req(prompt="x", num_draft_tokens=-1), "num_draft_tokens"),
    (req(prompt="x", num_draft_tokens=17), "num_draft_tokens"),
    (req(prompt="x", sampling=common_pb2.SamplingParams(temperature=-1)), "temperature"),
    (req(prompt="x", sampling=common_pb2.SamplingParams(temperature=1, top_p=2)), "top_p"),
    (req(messages=[generate_pb2.ChatMessage(role="robot", content="hi")]), "role"),
    (req(prompt_token_ids=[1, 768]), "vocabulary"),
    (req(prompt="x", logprobs=21), "logprobs must be in [0, 20]"),
    (req(prompt="x", prompt_logprobs=True), "prompt_logprobs needs logprobs"),
    (req(prompt="x", sampling=common_pb2.SamplingParams(presence_penalty=2.5)),
     "sampling.presence_penalty"),
    (req(prompt="x", sampling=common_pb2.SamplingParams(frequency_penalty=-3)),
     "sampling.frequency_penalty"),
    (req(prompt="x", sampling=common_pb2.SamplingParams(repetition_penalty=2.5)),
     "sampling.repetition_penalty"),
    (req(prompt="x", sampling=common_pb2.SamplingParams(logit_bias={5: 200})),
     "sampling.logit_bias[5]"),
    (req(prompt="x", sampling=common_pb2.SamplingParams(logit_bias={900: 1})),
     "sampling.logit_bias keys"),
    (req(prompt="x", sampling=common_pb2.SamplingParams(min_p=1.5)), "sampling.min_p"),
]


@pytest.mark.parametrize(("request_", "fragment"), BAD_REQUESTS)
def test_bad_requests_are_invalid_argument(generator_stub, request_, fragment):
    for call in (generator_stub.Generate,
                 lambda r, timeout: list(generator_stub.GenerateStream(r, timeout=timeout))):
        with pytest.raises(grpc.RpcError) as info:
            call(request_, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert fragment in info.value.details()
