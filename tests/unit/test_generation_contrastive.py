"""coordinator.api.service: the contrastive mode's fields, validated before any work."""

from __future__ import annotations

import dataclasses
import math

import pytest

from coordinator.api.service import GenerationService
from specdec.contrastive import LI, OBRIEN, ContrastiveParams
from specdec.errors import FailedPrecondition, InvalidArgument
from specdec.v1 import common_pb2, generate_pb2
from tests.unit import _generation_helpers
from tests.unit._generation_helpers import LIMITS, FakeLoop, request, service

tok = _generation_helpers.tok  # the shared module-scoped fixture
CD = generate_pb2.DECODING_CONTRASTIVE


def cd(**fields) -> common_pb2.ContrastiveParams:
    return common_pb2.ContrastiveParams(**fields)


def test_speculative_is_the_default_and_has_no_contrastive_params(tok):
    svc, _ = service(tok)
    assert svc.plan(request()).contrastive is None


def test_contrastive_defaults_and_given_values(tok):
    svc, _ = service(tok)
    assert svc.plan(request(decoding=CD)).contrastive == ContrastiveParams(formulation=OBRIEN)
    plan = svc.plan(request(decoding=CD, num_draft_tokens=0, contrastive=cd(
        alpha=0.25, amateur_temperature=0.5,
        formulation=common_pb2.CONTRASTIVE_FORMULATION_LI)))
    assert plan.k == 0  # the plain form
    p = plan.contrastive
    assert (p.alpha, p.beta, p.amateur_temperature, p.formulation) == (0.25, 0.5, 0.5, LI)
    # beta = 0 and alpha = 1 are allowed (the limits: the expert alone).
    assert svc.plan(request(decoding=CD, contrastive=cd(beta=0.0, alpha=1.0))).contrastive


@pytest.mark.parametrize(("fields", "fragment"), [
    (cd(alpha=0.0), "alpha must be in (0, 1]"),
    (cd(alpha=1.5), "alpha must be in (0, 1]"),
    (cd(alpha=math.nan), "alpha must be in (0, 1]"),
    (cd(beta=-0.1), "beta must be a finite number >= 0"),
    (cd(beta=math.inf), "beta must be a finite number >= 0"),
    (cd(amateur_temperature=0.0), "amateur_temperature must be > 0"),
    (cd(formulation=9), "contrastive.formulation: unknown value 9"),
])
def test_bad_contrastive_params_are_invalid_argument(tok, fields, fragment):
    svc, loop = service(tok)
    with pytest.raises(InvalidArgument, match=None) as info:
        svc.plan(request(decoding=CD, contrastive=fields))
    assert fragment in str(info.value)
    assert not loop.calls


@pytest.mark.parametrize(("kw", "fragment"), [
    (dict(decoding=7), "decoding must be SPECULATIVE (0) or CONTRASTIVE (1)"),
    (dict(contrastive=cd(alpha=0.2)), "but decoding is SPECULATIVE"),
    (dict(decoding=CD, sampling=common_pb2.SamplingParams(temperature=1, top_k=5)),
     "top_k and top_p must be off"),
    (dict(decoding=CD, sampling=common_pb2.SamplingParams(temperature=1, top_p=0.9)),
     "top_k and top_p must be off"),
])
def test_inconsistent_requests_are_invalid_argument(tok, kw, fragment):
    svc, _ = service(tok)
    with pytest.raises(InvalidArgument) as info:
        svc.plan(request(**kw))
    assert fragment in str(info.value)


def test_no_draft_is_failed_precondition(tok):
    loop = FakeLoop([])
    loop.draft = None
    svc = GenerationService(loop, tok, dataclasses.replace(LIMITS, max_draft_tokens=0), [2])
    with pytest.raises(FailedPrecondition, match="contrastive decoding needs a draft service"):
        svc.plan(request(decoding=CD))
    assert svc.plan(request()).k == 0  # speculative requests still decode target-only
