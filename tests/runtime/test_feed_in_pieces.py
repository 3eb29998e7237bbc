"""A step longer than the token budget is fed in budget-sized passes (cached_model.
feed_in_pieces): the same logits and cache as one pass, no pass over the budget, and a
failed piece leaves the cache where it stood."""

from __future__ import annotations

import random

import pytest
import torch

from specdec.runtime.cached_model import CachedModel, feed_in_pieces
from specdec.runtime.models import TINY_TARGET, load
from specdec.runtime.torch_backend import TorchBackend

TOL = 1e-4  # f32, as tests/runtime/test_batched_forward.py


class Recording:
    """A backend that records the tokens of each pass, and fails pass `fail_at`."""

    def __init__(self, backend, fail_at: int = -1):
        self.backend, self.fail_at, self.passes = backend, fail_at, []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def forward_batch(self, items):
        self.passes.append(sum(len(tokens) for _, tokens, _ in items))
        if len(self.passes) - 1 == self.fail_at:
            raise RuntimeError("this pass fails")
        return self.backend.forward_batch(items)


@pytest.fixture(scope="module")
def backend():
    return TorchBackend(load(TINY_TARGET))


def _tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 700) for _ in range(n)]


@pytest.mark.parametrize(("n", "budget", "keep_last"), [(37, 8, 1), (33, 8, 3), (16, 8, 8),
                                                        (20, 8, 12), (9, 8, 9)])
def test_pieces_give_the_logits_and_cache_of_one_pass(backend, n, budget, keep_last):
    tokens = _tokens(n)
    whole = backend.new_cache()
    expected = backend.forward_batch([(whole, tokens, keep_last)])[0]
    recording = Recording(backend)
    cache = backend.new_cache()
    got = feed_in_pieces(recording, cache, tokens, keep_last, budget)
    assert got.shape == expected.shape == (keep_last, backend.vocab_size)
    assert torch.allclose(got, expected, atol=TOL), (got - expected).abs().max()
    assert sum(recording.passes) == n and backend.cache_len(cache) == n
    assert max(recording.passes[:-1], default=0) <= budget  # the last holds keep_last rows
    assert recording.passes[-1] <= max(budget, keep_last)
    nxt = [5]  # the caches continue alike
    a = backend.forward_batch([(whole, nxt, 1)])[0]
    b = backend.forward_batch([(cache, nxt, 1)])[0]
    assert torch.allclose(a, b, atol=TOL)


def test_a_failed_piece_leaves_the_cache_where_it_stood(backend):
    cache = backend.new_cache()
    backend.forward_batch([(cache, _tokens(5, 1), 1)])
    with pytest.raises(RuntimeError, match="this pass fails"):
        feed_in_pieces(Recording(backend, fail_at=2), cache, _tokens(30), 1, 8)
    assert backend.cache_len(cache) == 5
    got = feed_in_pieces(backend, cache, _tokens(30), 1, 8)  # and it can go on
    ref = backend.new_cache()
    expected = backend.forward_batch([(ref, _tokens(5, 1) + _tokens(30), 1)])[0]
    assert torch.allclose(got, expected, atol=TOL)


def test_the_scheduler_never_runs_a_pass_over_the_budget(backend):
    recording = Recording(backend)
    model = CachedModel(recording, max_batch_tokens=8)
    try:
        long, short = backend.new_cache(), backend.new_cache()
        results = model.scheduler.run_many([("a", (long, _tokens(29), 2))])
        results += model.scheduler.run_many([("b", (short, _tokens(6), 1))])
        assert [error for _, _, error in results] == [None, None]
        assert results[0][0].shape == (2, backend.vocab_size)
        assert max(recording.passes) <= 8 and sum(recording.passes) == 35
        assert backend.cache_len(long) == 29 and backend.cache_len(short) == 6
    finally:
        model.close()
