"""The torch backend's KV-cache bookkeeping against fresh prefills (tiny model)."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime.models import load
from specdec.runtime.torch_backend import TorchBackend


@pytest.fixture(scope="module")
def backend():
    return TorchBackend(load("tiny-random"))


def prefill_logits(backend, tokens, keep_last=1):
    return backend.forward(backend.new_cache(), tokens, keep_last)


def test_incremental_feeding_matches_one_prefill(backend):
    tokens = [5, 17, 300, 2, 99, 640, 11]
    cache = backend.new_cache()
    backend.forward(cache, tokens[:3])
    backend.forward(cache, tokens[3:4])
    logits = backend.forward(cache, tokens[4:], keep_last=3)
    expected = prefill_logits(backend, tokens, keep_last=3)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert backend.cache_len(cache) == len(tokens)


@pytest.mark.parametrize("keep", [0, 1, 4, 7])
def test_crop_then_extend_matches_fresh_prefill(backend, keep):
    committed = [3, 1, 4, 1, 5, 9, 2, 6]
    rejected = [700, 701, 702, 703]
    cache = backend.new_cache()
    backend.forward(cache, committed + rejected, keep_last=1)
    backend.crop(cache, keep)
    assert backend.cache_len(cache) == keep
    follow = [42, 43]
    logits = backend.forward(cache, committed[keep:] + follow, keep_last=2)
    expected = prefill_logits(backend, committed + follow, keep_last=2)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_crop_beyond_length_is_a_no_op(backend):
    cache = backend.new_cache()
    backend.forward(cache, [1, 2, 3])
    backend.crop(cache, 10)
    assert backend.cache_len(cache) == 3


def test_keep_last_returns_the_last_positions(backend):
    tokens = [8, 9, 10, 11]
    all_rows = prefill_logits(backend, tokens, keep_last=4)
    last_two = prefill_logits(backend, tokens, keep_last=2)
    assert all_rows.shape == (4, backend.vocab_size)
    torch.testing.assert_close(last_two, all_rows[2:], rtol=1e-4, atol=1e-4)
