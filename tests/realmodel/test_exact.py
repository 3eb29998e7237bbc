"""The real SmolLM2 model through the real services: greedy K=4 equals K=0."""

from __future__ import annotations

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.setup import build_service
from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from specdec.v1 import generate_pb2
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]

PROMPTS = ["What is the capital of France? Answer in one sentence.",
           "Write a Python function that reverses a string."]


PAIRS = {
    # torch fp32 target, torch int8 draft
    "torch": ({}, {"quantize": "int8"}),
    # the default pair: OpenVINO fp32 target, OpenVINO int8 draft
    "openvino": ({"backend": "openvino", "weights": "fp32"},
                 {"backend": "openvino", "weights": "int8"}),
}


@pytest.fixture(scope="module", params=list(PAIRS))
def service(prepared, request):
    target_kw, draft_kw = PAIRS[request.param]
    if request.param == "openvino":
        from specdec.runtime.openvino_export import export

        for weights in ("fp32", "int8"):
            export(prepared, weights)  # cached after the first run (~35 s)
    target, tport, _ = create_target(TargetConfig(model="smollm2-135m", port=0, **target_kw))
    draft, dport, _ = create_draft(DraftConfig(model="smollm2-135m", port=0, **draft_kw))
    target.start()
    draft.start()
    yield build_service(CoordinatorConfig(draft=f"127.0.0.1:{dport}",
                                          target=f"127.0.0.1:{tport}",
                                          pipeline=request.param == "openvino"))
    draft.stop(0)
    target.stop(0)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_k4_equals_target_only(service, prompt):
    def run(k):
        req = generate_pb2.GenerateRequest(max_new_tokens=40, num_draft_tokens=k)
        req.messages.add(role="user", content=prompt)
        return service.generate(req)

    base, spec = run(0), run(4)
    print(f"\n{prompt}\n-> {spec.text!r}\n   accepted {spec.stats.accepted_tokens}/"
          f"{spec.stats.drafted_tokens}")
    assert list(spec.token_ids) == list(base.token_ids)
    assert spec.text == base.text and spec.text.strip()
    assert spec.stats.accepted_tokens > 0
    # The OpenVINO pair runs with pipelined drafting (the default of `specdec up`).
    if service.loop.pipeline and len(spec.token_ids) >= 12:
        assert spec.stats.pipelined_rounds > 0
    if not service.loop.pipeline:
        assert spec.stats.pipelined_rounds == spec.stats.predrafts_wasted == 0
