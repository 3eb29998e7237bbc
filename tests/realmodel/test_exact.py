"""The real SmolLM2 model through the real services: greedy K=4 equals K=0."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.setup import build_service
from specdec import pair as pairs
from tests.realmodel.conftest import greedy_k4_equals_target_only

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]

PROMPTS = ["What is the capital of France? Answer in one sentence.",
           "Write a Python function that reverses a string."]


PAIRS = {
    # torch fp32 target, torch int8 draft
    "torch": next(p for p in pairs.CANDIDATES if p.name == "torch-fp32 target + torch-int8 draft"),
    # the default pair: OpenVINO fp32 target, OpenVINO int8 draft
    "openvino": pairs.DEFAULT_PAIR,
}


@pytest.fixture(scope="module", params=list(PAIRS))
def service(prepared, request):
    if request.param == "openvino":
        from specdec.runtime.openvino_export import export

        for weights in ("fp32", "int8"):
            export(prepared, weights)  # cached after the first run (~35 s)
    with ExitStack() as stack:
        running = pairs.start(PAIRS[request.param], stack)
        yield build_service(CoordinatorConfig(draft=running.draft.address,
                                              target=running.target.address,
                                              pipeline=request.param == "openvino"))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_k4_equals_target_only(service, prompt):
    spec = greedy_k4_equals_target_only(service, prompt)
    # The OpenVINO pair runs with pipelined drafting (the default of `specdec up`).
    if service.loop.policy.pipeline and len(spec.token_ids) >= 12:
        assert spec.stats.pipelined_rounds > 0
    if not service.loop.policy.pipeline:
        assert spec.stats.pipelined_rounds == spec.stats.predrafts_wasted == 0
