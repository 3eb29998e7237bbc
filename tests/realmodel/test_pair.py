"""The Qwen2.5-Coder pair (issue 39), as a user gets it: `specdec prepare --pair
qwen2.5-coder`, then `specdec up --pair qwen2.5-coder` (the same StackConfig), and the
same models given as folders. Marked `pair`: `make test-pair` runs these, `make test`
does not (the pair is ~10 GB and minutes to prepare)."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from specdec.paths import QWEN_CODER_DRAFT, QWEN_CODER_TARGET, model_dir

pytestmark = [pytest.mark.pair, pytest.mark.slow]

PROMPTS = [  # greedy, 48 tokens: one code question, one chat question
    "Write a Python function that merges two sorted lists into one sorted list.",
    "What should I pack for a three-day hiking trip in autumn?",
]


@pytest.fixture(scope="module")
def irs() -> tuple[Path, Path]:
    """`specdec prepare --pair qwen2.5-coder` (a cache hit after `make prepare-pair`):
    its last two lines name the IR folders."""
    out = subprocess.run([sys.executable, "-m", "specdec.cli", "prepare", "--pair",
                          "qwen2.5-coder"], capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    *_, target, draft = out.stdout.strip().splitlines()
    assert target.startswith("target: ") and draft.startswith("draft: ")
    return Path(target.removeprefix("target: ")), Path(draft.removeprefix("draft: "))


def test_prepared_irs_and_their_tokenizer(irs):
    from transformers import AutoTokenizer

    for ir in irs:
        assert (ir / "openvino_model.xml").is_file() and (ir / "openvino_tokenizer.xml").is_file()
    tok = AutoTokenizer.from_pretrained(str(irs[0]), local_files_only=True)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.encode("Hello world") == [9707, 1879]
    config = json.loads((model_dir(QWEN_CODER_TARGET) / "generation_config.json").read_text())
    assert config["eos_token_id"] == [151645, 151643]


def _greedy(address: str, k: int | None, prompt: str):
    from specdec.tls import open_channel
    from specdec.v1 import generate_pb2, generate_pb2_grpc

    req = generate_pb2.GenerateRequest(max_new_tokens=48)
    if k is not None:
        req.num_draft_tokens = k
    req.messages.add(role="user", content=prompt)
    with open_channel(address) as channel:
        return generate_pb2_grpc.GeneratorStub(channel).Generate(req, timeout=300)


def _stack(pair):
    from specdec import stack
    from specdec_tools.bench.drain import free_port

    es = ExitStack()
    running = stack.start(stack.StackConfig(pair=pair, port=free_port(), draft_port=0,
                                            target_port=0, http_port=0), es)
    return es, running.address


def _check_exact(address: str) -> list:
    """Greedy output with the server's K and with K=4 equals target-only output."""
    replies = []
    for prompt in PROMPTS:
        base = _greedy(address, 0, prompt)
        for k in (None, 4):
            spec = _greedy(address, k, prompt)
            assert list(spec.token_ids) == list(base.token_ids), (prompt, k)
            replies.append(spec)
    return replies


def test_up_pair_is_exact_and_drafts(irs):
    from specdec.pair import SERVED

    es, address = _stack(SERVED["qwen2.5-coder"])
    with es:
        replies = _check_exact(address)
    code_k4 = replies[1].stats
    assert code_k4.drafted_tokens > 0
    assert code_k4.accepted_tokens / code_k4.drafted_tokens >= 0.5  # measured ~0.9


def test_models_given_as_hugging_face_folders(irs):
    """`specdec up --target-model FOLDER --draft-model FOLDER`: the services take each
    folder's IR beside it, and the coordinator the target folder's tokenizer."""
    from specdec.pair import SERVED

    pair = SERVED["qwen2.5-coder"].with_models(str(model_dir(QWEN_CODER_TARGET)),
                                               str(model_dir(QWEN_CODER_DRAFT)))
    es, address = _stack(pair)
    with es:
        _check_exact(address)
