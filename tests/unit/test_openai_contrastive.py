"""coordinator.api.openai_api: the contrastive extension fields (`decoding`, `contrastive`)."""

from __future__ import annotations

import pytest

from coordinator.api.openai_api import chat_request, completion_request
from coordinator.api.openai_errors import APIError, from_exception
from specdec.errors import FailedPrecondition, InvalidArgument
from specdec.v1 import common_pb2, generate_pb2

M = "smollm2-135m"
MSG = [{"role": "user", "content": "hi"}]


def test_decoding_is_speculative_unless_asked():
    req, _ = chat_request({"model": M, "messages": MSG}, M)
    assert req.decoding == generate_pb2.DECODING_SPECULATIVE
    assert not req.HasField("contrastive")


def test_contrastive_fields_map_onto_the_generate_request():
    req, _ = completion_request({"model": M, "prompt": "x", "decoding": "contrastive",
                                 "num_draft_tokens": 0, "contrastive": {
                                     "alpha": 0.2, "beta": 1, "amateur_temperature": 0.5,
                                     "formulation": "li"}}, M)
    assert req.decoding == generate_pb2.DECODING_CONTRASTIVE and req.num_draft_tokens == 0
    c = req.contrastive
    assert (round(c.alpha, 6), c.beta, c.amateur_temperature) == (0.2, 1.0, 0.5)
    assert c.formulation == common_pb2.CONTRASTIVE_FORMULATION_LI
    req, _ = chat_request({"model": M, "messages": MSG, "decoding": "contrastive"}, M)
    assert not req.contrastive.HasField("alpha")  # the server's defaults


@pytest.mark.parametrize(("change", "param"), [
    ({"decoding": "fast"}, "decoding"),
    ({"decoding": 1}, "decoding"),
    ({"decoding": "contrastive", "contrastive": []}, "contrastive"),
    ({"decoding": "contrastive", "contrastive": {"gamma": 1}}, "contrastive"),
    ({"decoding": "contrastive", "contrastive": {"alpha": "high"}}, "contrastive.alpha"),
    ({"decoding": "contrastive", "contrastive": {"beta": True}}, "contrastive.beta"),
    ({"decoding": "contrastive", "contrastive": {"formulation": "x"}},
     "contrastive.formulation"),
])
def test_bad_contrastive_bodies_are_400(change, param):
    with pytest.raises(APIError) as info:
        chat_request({"model": M, "messages": MSG, **change}, M)
    assert (info.value.status, info.value.param) == (400, param)


def test_service_errors_name_the_contrastive_parameter():
    err = from_exception(InvalidArgument("alpha must be in (0, 1] (...), got 0.0"))
    assert (err.status, err.param) == (400, "contrastive.alpha")
    err = from_exception(FailedPrecondition("contrastive decoding needs a draft service"))
    assert (err.status, err.type, err.code) == (400, "invalid_request_error",
                                                "failed_precondition")


def test_one_set_of_names_for_the_formulations():
    from specdec.client.request import FORMULATIONS
    from specdec.contrastive import LI, OBRIEN

    assert set(FORMULATIONS) == {LI, OBRIEN}
    assert set(FORMULATIONS.values()) == set(common_pb2.ContrastiveFormulation.values())
