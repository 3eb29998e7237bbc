"""`--model PATH`: a Hugging Face folder on disk loads offline with its tokenizer."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime import models
from specdec.runtime.torch_backend import TorchBackend


def save_tiny_folder(path, vocab_size: int):
    """Write tiny-random and a word-level tokenizer over the same ids as an HF folder."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    loaded = models.build_tiny(models.TINY_TARGET)
    loaded.model.save_pretrained(path)
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(path)
    return loaded


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-folder")
    save_tiny_folder(path, models.TINY_VOCAB)
    return path


def test_folder_loads_with_tokenizer_and_same_logits(folder):
    loaded = models.load(str(folder))
    assert loaded.model_id == folder.name
    assert loaded.vocab_size == models.TINY_VOCAB
    assert loaded.tokenizer.encode("w5 w7 w700", add_special_tokens=False) == [5, 7, 700]
    reference = TorchBackend(models.load(models.TINY_TARGET))
    backend = TorchBackend(loaded)
    prompt = [5, 7, 700, 3]
    torch.testing.assert_close(backend.forward(backend.new_cache(), prompt),
                               reference.forward(reference.new_cache(), prompt))


def test_tokenizer_digest_is_stable_and_content_sensitive(folder, tmp_path):
    a = models.load(str(folder)).tokenizer_digest
    assert a == models.load(str(folder)).tokenizer_digest
    save_tiny_folder(tmp_path, models.TINY_VOCAB - 1)
    assert models.load(str(tmp_path)).tokenizer_digest != a
