"""A model service's tokenizer facts come from a child process and a sidecar file, and the
Hugging Face tokenizer loads only when code asks for it (specdec.runtime.lean_tokenizer)."""

from __future__ import annotations

import json
import os

import llguidance.hf
import pytest
from transformers import AutoTokenizer

from specdec.runtime import lean_tokenizer
from specdec.runtime.models import TINY_TARGET, tokenizer_digest
from specdec.runtime.openvino_export import export_tiny

TEXT = "def generate(prompt):\n    return {'token': 7}  # the quick brown fox"


@pytest.fixture()
def folder(tmp_path_factory):
    ir = export_tiny(TINY_TARGET, "fp32", tmp_path_factory.mktemp("home"))
    (ir / lean_tokenizer.SIDECAR).unlink(missing_ok=True)
    return ir


def test_the_facts_equal_the_hugging_face_tokenizers_and_are_kept_beside_the_model(folder):
    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    known = lean_tokenizer.facts(folder)
    assert known.digest == tokenizer_digest(hf)
    assert known.eos_token_id == hf.eos_token_id
    sidecar = folder / lean_tokenizer.SIDECAR
    assert json.loads(sidecar.read_text())["digest"] == known.digest
    before = sidecar.stat().st_mtime_ns
    assert lean_tokenizer.facts(folder) == known  # read back, not computed again
    assert sidecar.stat().st_mtime_ns == before


def test_a_changed_tokenizer_file_makes_them_computed_again(folder):
    lean_tokenizer.facts(folder)
    sidecar = folder / lean_tokenizer.SIDECAR
    data = json.loads(sidecar.read_text())
    data["digest"] = "stale"
    sidecar.write_text(json.dumps(data))
    config = folder / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert lean_tokenizer.facts(folder).digest != "stale"


def test_llguidance_gets_its_tokenizer_without_the_hugging_face_one(folder):
    lazy = lean_tokenizer.LazyTokenizer(folder, lean_tokenizer.facts(folder))
    ours = lazy.llguidance_tokenizer(768)
    assert lazy._loaded is None
    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    theirs = llguidance.hf.from_tokenizer(hf, n_vocab=768)
    assert ours.tokenize_str(TEXT) == theirs.tokenize_str(TEXT)
    assert ours.eos_token == theirs.eos_token
    # and the Hugging Face tokenizer when asked for
    assert lazy.encode(TEXT, add_special_tokens=False) == hf.encode(TEXT, add_special_tokens=False)
    assert lazy(TEXT)["input_ids"] == hf(TEXT)["input_ids"]
    assert len(lazy) == len(hf)


def test_an_unreadable_tokenizer_says_which_folder(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(RuntimeError, match=str(tmp_path)):
        lean_tokenizer.facts(tmp_path)
