"""specdec.runtime.dynamic_skip: a constant set computes what the pruned model computes,
any mix of sets keeps every layer's cache whole, and no set is the whole model; in one
batch too. draft_service.skip_climb: hill climbing one step per decision."""

from __future__ import annotations

import pytest
import torch

from draft_service.skip_climb import SkipClimber
from specdec.runtime.dynamic_skip import DynamicSkip
from specdec.runtime.layer_skip import drop_layers, parse_order
from specdec.runtime.models import TINY_TARGET, build_tiny
from specdec.runtime.torch_backend import TorchBackend

IDS = [5, 17, 300, 42, 9, 611, 3, 77]


def run(backend, chunks):
    cache = backend.new_cache()
    return [backend.forward(cache, c, keep_last=len(c)) for c in chunks], cache


@pytest.mark.parametrize("skip", [(0,), (1,)])
def test_a_constant_set_is_the_pruned_model(skip):
    pruned = build_tiny(TINY_TARGET)
    drop_layers(pruned.model, skip)
    want, _ = run(TorchBackend(pruned), [IDS[:5], IDS[5:6], IDS[6:]])
    loaded = build_tiny(TINY_TARGET)
    dyn = DynamicSkip(loaded.model)
    dyn.set(skip)
    got, cache = run(TorchBackend(loaded), [IDS[:5], IDS[5:6], IDS[6:]])
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-5)
    # The skipped layer's cache was written all the same.
    assert [int(layer.keys.shape[-2]) for layer in cache.layers] == [len(IDS)] * 2


def test_no_set_is_the_whole_model_and_mixed_sets_keep_the_cache_whole():
    whole, _ = run(TorchBackend(build_tiny(TINY_TARGET)), [IDS[:4], IDS[4:]])
    loaded = build_tiny(TINY_TARGET)
    dyn = DynamicSkip(loaded.model)
    backend = TorchBackend(loaded)
    got, _ = run(backend, [IDS[:4], IDS[4:]])
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, whole, strict=True))
    cache = backend.new_cache()
    for i, token in enumerate(IDS):
        dyn.set([(0,), (1,), ()][i % 3])
        out = backend.forward(cache, [token])
        assert torch.isfinite(out).all()
    assert backend.cache_len(cache) == len(IDS)
    assert [int(layer.keys.shape[-2]) for layer in cache.layers] == [len(IDS)] * 2
    # Layer 1's keys at a position it skipped are its projection of the state it got:
    # non-zero, unlike an unwritten slot.
    assert float(cache.layers[1].keys[..., 1, :].abs().sum()) > 0


def test_a_batch_with_a_set_equals_its_sessions_alone():
    loaded = build_tiny(TINY_TARGET)
    dyn = DynamicSkip(loaded.model)
    dyn.set((1,))
    backend = TorchBackend(loaded)
    prompts = [[1, 2, 3], [400, 500, 17, 9, 9]]
    alone = [run(backend, [p])[0][0] for p in prompts]
    caches = [backend.new_cache() for _ in prompts]
    batched = backend.forward_batch([(c, p, len(p)) for c, p in zip(caches, prompts,
                                                                  strict=True)])
    for b, a in zip(batched, alone, strict=True):
        assert torch.allclose(b, a, atol=1e-4)


def test_orders_keep_their_order():
    assert parse_order("12,3,5-6,3") == (12, 3, 5, 6)


def test_the_policy_climbs_to_the_best_depth_one_step_at_a_time():
    # Rounds drafted with m skipped layers return at a rate peaking at m = 3.
    climber = SkipClimber(order=(4, 2, 7, 1, 6, 0), max_skip=6, window=4)
    for _ in range(400):
        m = climber.m
        climber.observe(m, accepted=2, seconds=1.0 / (10 - (m - 3) ** 2))
    assert climber.best == 3
    assert all(abs(a - b) <= 1 for a, b in zip(climber.history, climber.history[1:],
                                                strict=False))
    assert set(climber.history) <= {2, 3, 4} | set(range(4))
    assert climber.skip_set(3) == (2, 4, 7)
    with pytest.raises(ValueError):
        SkipClimber(order=(1, 2), max_skip=3)
