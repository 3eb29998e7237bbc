"""llama.cpp's server as a bench peer on the Qwen2.5-Coder pair's own GGUF files
(`specdec bench --pair qwen2.5-coder --peers llamacpp`): it starts, answers the chat
template's token ids, and with the draft on -md it drafts and its greedy text equals its
plain text. Marked `pair`; skipped with the build command where `make llamacpp` has not
built the server."""

from __future__ import annotations

import pytest

from specdec.model_pairs import QWEN_CODER, gguf_dir
from specdec.paths import tokenizer_dir
from specdec.sampling import SamplingParams

pytestmark = [pytest.mark.pair, pytest.mark.slow]


def test_llamacpp_speculative_equals_its_plain_greedy():
    from specdec.runtime.models import load_tokenizer
    from specdec_tools.bench import llamacpp_peer

    try:
        llamacpp_peer.find_server()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    ggufs = [gguf_dir() / m.parts.gguf for m in QWEN_CODER.models]
    if not all(p.exists() for p in ggufs):
        pytest.skip("the pair's GGUF files are not joined: make prepare-pair")
    tokenizer = load_tokenizer(str(tokenizer_dir(QWEN_CODER.target.name)))
    prompt = "Write a Python function that returns the n-th Fibonacci number."
    greedy = SamplingParams(temperature=0.0)
    runs = {}
    for draft in (None, ggufs[1]):
        peer = llamacpp_peer.LlamaCppScenario(str(ggufs[0]), str(draft) if draft else None,
                                              4, 1, tokenizer)
        try:
            runs[draft is not None] = peer.run(prompt, 32, greedy)
        finally:
            peer.close()
    plain, spec = runs[False], runs[True]
    assert plain.tokens == 32 and plain.seconds > 0
    assert spec.drafted > 0, "the -md draft drafted nothing"
    assert spec.text == plain.text and spec.text.strip()
