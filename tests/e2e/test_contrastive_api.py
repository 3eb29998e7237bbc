"""Contrastive decoding through the real coordinator (Ray Serve): gRPC Generate and the
official `openai` client give the in-process reference's tokens, and bad fields get
their statuses; without a draft the mode is FAILED_PRECONDITION."""

from __future__ import annotations

import grpc
import openai
import pytest

from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.setup import build_service
from specdec.contrastive import LI
from specdec.errors import FailedPrecondition
from specdec.v1 import common_pb2, generate_pb2
from tests.service._contrastive_helpers import params, reference

pytestmark = pytest.mark.slow
PROMPT = [1, 2, 3, 4, 5]
N = 24


def request(k: int, **contrastive) -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(
        prompt_token_ids=PROMPT, max_new_tokens=N, num_draft_tokens=k,
        sampling=common_pb2.SamplingParams(temperature=0),
        decoding=generate_pb2.DECODING_CONTRASTIVE,
        contrastive=common_pb2.ContrastiveParams(**contrastive))


@pytest.mark.parametrize("k", [0, 4])
def test_grpc_contrastive_equals_the_reference(generator_stub, k):
    li = dict(formulation=common_pb2.CONTRASTIVE_FORMULATION_LI, amateur_temperature=0.5)
    resp = generator_stub.Generate(request(k, **li), timeout=60)
    assert list(resp.token_ids) == reference(PROMPT, params(LI, amateur_temperature=0.5), N)
    assert resp.stats.mean_head_size >= 1 and resp.finish_reason == "length"
    stream = list(generator_stub.GenerateStream(request(k, **li), timeout=60))
    assert [t for c in stream for t in c.token_ids] == list(resp.token_ids)


def test_bad_contrastive_fields_are_invalid_argument(generator_stub):
    for fields, fragment in [(dict(alpha=0.0), "alpha must be in (0, 1]"),
                             (dict(beta=-1.0), "beta must be"),
                             (dict(amateur_temperature=-2.0), "amateur_temperature")]:
        with pytest.raises(grpc.RpcError) as info:
            generator_stub.Generate(request(4, **fields), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in info.value.details()


def test_openai_client_contrastive_equals_grpc(coordinator, generator_stub):
    with openai.OpenAI(base_url=coordinator[3] + "/v1", api_key="unused", max_retries=0,
                       timeout=60) as client:
        model = client.models.list().data[0].id
        want = generator_stub.Generate(request(4), timeout=60)
        got = client.completions.create(model=model, prompt=PROMPT, max_tokens=N,
                                        temperature=0, extra_body={
                                            "decoding": "contrastive",
                                            "num_draft_tokens": 4, "contrastive": {}})
        assert got.choices[0].text == want.text
        assert got.model_extra["specdec"]["token_ids"] == list(want.token_ids)
        assert got.usage.model_extra["specdec"]["mean_head_size"] > 0
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=model, prompt="x", max_tokens=4, extra_body={
                "decoding": "contrastive", "contrastive": {"alpha": 2}})
        assert info.value.param == "contrastive.alpha"


def test_without_a_draft_contrastive_is_failed_precondition(target_server):
    service = build_service(CoordinatorConfig(target=target_server[0], draft=""))
    with pytest.raises(FailedPrecondition, match="contrastive decoding needs a draft service"):
        list(service.stream(request(0)))
    assert list(service.stream(generate_pb2.GenerateRequest(  # speculative still works
        prompt_token_ids=PROMPT, max_new_tokens=3)))[-1].finish_reason == "length"


def test_a_batch_dependent_amateur_is_failed_precondition(target_server):
    """torch's dynamic int8 draft scales activations per pass, so its logits depend on
    the batch: it says so in Info, and contrastive decoding refuses it (speculative
    decoding, which it cannot make inexact, still runs)."""
    from draft_service.__main__ import create as create_draft
    from draft_service.config import DraftConfig

    server, port, engine = create_draft(DraftConfig(model="tiny-random-draft", port=0,
                                                    quantize="int8"))
    server.start()
    try:
        assert engine.info().batch_dependent_logits
        service = build_service(CoordinatorConfig(target=target_server[0],
                                                  draft=f"127.0.0.1:{port}"))
        with pytest.raises(FailedPrecondition, match="--dynamic-quantization off"):
            list(service.stream(request(4)))
        assert list(service.stream(generate_pb2.GenerateRequest(
            prompt_token_ids=PROMPT, max_new_tokens=3)))[-1].finish_reason == "length"
    finally:
        server.stop(0)
