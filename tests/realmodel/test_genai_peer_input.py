"""The benchmarks' OpenVINO GenAI peers continue exactly the prompt specdec continues.

LLMPipeline.generate applies the model's chat template to a string by default; given
specdec's already templated text it templated it twice and continued another prompt (on
the shipped translation prompt: 96 tokens of a repeated phrase against specdec's 21), so
every GenAI row compared speed on other text. The peer now gets our token ids."""

from __future__ import annotations

import pytest

from specdec.sampling import SamplingParams
from specdec_tools.bench.prompts import PROMPTS
from specdec_tools.bench.scenarios import build

pytestmark = [pytest.mark.slow, pytest.mark.realmodel]


def test_genai_greedy_ids_equal_the_in_process_target_on_the_same_prompt(prepared):
    pytest.importorskip("openvino_genai")
    from specdec.runtime.openvino_export import export

    target_ir, draft_ir = str(export(prepared, "fp32")), str(export(prepared, "int8"))
    args = (target_ir, draft_ir, str(prepared), 4, 1, "f32")
    ours = build("inprocess", *args)
    message = dict(PROMPTS)["translation"]
    want = ours.run(message, 12, SamplingParams()).token_ids
    assert len(want) == 12
    for kind in ("genai-plain", "genai-lookup"):
        peer = build(kind, *args)
        try:
            got = peer.run(message, 12, SamplingParams())
        finally:
            peer.close()
        assert got.token_ids == want, kind
        assert got.tokens == 12
