"""forward_batch equals forward, session by session, on both backends.

Ragged batches (sessions of different cached lengths feeding different numbers of
tokens, a prefill beside one-token steps), rollbacks between passes, sessions joining
and leaving: every session's logits in a batch match the same session fed alone within
f32 tolerance, and greedy continuations are identical.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdec.runtime.models import TINY_TARGET, load
from specdec.runtime.openvino_export import export_tiny
from specdec.runtime.openvino_paged import PagedOpenVINOBackend
from specdec.runtime.torch_backend import TorchBackend

TOL = 1e-4  # f32; measured max |delta logit| is printed by test_batched_matches_alone


@pytest.fixture(scope="module")
def ir_dir(tmp_path_factory):
    return export_tiny(TINY_TARGET, "fp32", tmp_path_factory.mktemp("home"))


def _paged(ir_dir, blocks=2):
    # Few initial blocks, so the pool grows (and copies its tensors) during the test.
    return PagedOpenVINOBackend(ir_dir, "CPU", threads=1, model_id=TINY_TARGET,
                                initial_blocks=blocks)


@pytest.fixture(scope="module", params=["torch", "openvino-paged"])
def backends(request, ir_dir):
    """(batched backend, reference backend fed one session at a time)."""
    if request.param == "torch":
        return TorchBackend(load(TINY_TARGET)), TorchBackend(load(TINY_TARGET))
    return _paged(ir_dir), _paged(ir_dir)


def _script(seed: int, sessions: int, passes: int):
    """Per pass, per session: None (sits out), or (crop_to or None, tokens, keep_last)."""
    rng = random.Random(seed)
    lengths = [0] * sessions
    plan = []
    for p in range(passes):
        row = []
        for s in range(sessions):
            if p > 0 and rng.random() < 0.25:
                row.append(None)
                continue
            crop = None
            if lengths[s] > 2 and rng.random() < 0.4:  # a rollback of rejected drafts
                crop = rng.randrange(1, lengths[s])
                lengths[s] = crop
            n = rng.choice([1, 1, 2, 5]) if lengths[s] else rng.randrange(3, 40)
            tokens = [rng.randrange(1, 700) for _ in range(n)]
            row.append((crop, tokens, rng.randrange(1, n + 1)))
            lengths[s] += n
        plan.append(row)
    return plan


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_matches_alone(backends, seed):
    batched, alone = backends
    sessions = 5
    caches = [batched.new_cache() for _ in range(sessions)]
    refs = [alone.new_cache() for _ in range(sessions)]
    worst = 0.0
    for row in _script(seed, sessions, passes=12):
        items, expected = [], []
        for s, work in enumerate(row):
            if work is None:
                continue
            crop, tokens, keep = work
            if crop is not None:
                batched.crop(caches[s], crop)
                alone.crop(refs[s], crop)
            items.append((caches[s], tokens, keep))
            expected.append(alone.forward(refs[s], tokens, keep))
        got = batched.forward_batch(items)
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape
            worst = max(worst, float((g - e).abs().max()))
        for cache, ref in zip(caches, refs, strict=True):
            assert batched.cache_len(cache) == alone.cache_len(ref)
    print(f"max |delta logit| batched vs alone: {worst:.2e}")
    assert worst < TOL


def test_greedy_continuations_are_identical_in_a_batch(backends):
    batched, alone = backends
    prompts = [[1, 2, 3], [400, 500, 17, 9, 9, 30, 41], [7] * 19, [650]]
    expected = []
    for p in prompts:
        cache = alone.new_cache()
        logits, ids = alone.forward(cache, p)[0], []
        for _ in range(8):
            ids.append(int(logits.argmax()))
            logits = alone.forward(cache, ids[-1:])[0]
        expected.append(ids)
    caches = [batched.new_cache() for _ in prompts]
    logits = [x[0] for x in batched.forward_batch(
        [(c, p, 1) for c, p in zip(caches, prompts, strict=True)])]
    got: list[list[int]] = [[] for _ in prompts]
    for _ in range(8):
        for i in range(len(prompts)):
            got[i].append(int(logits[i].argmax()))
        logits = [x[0] for x in batched.forward_batch(
            [(c, g[-1:], 1) for c, g in zip(caches, got, strict=True)])]
    assert got == expected


def test_paged_pool_returns_blocks_of_forgotten_sessions(ir_dir):
    backend = _paged(ir_dir, blocks=4)
    pool = backend.pool
    cache = backend.new_cache()
    backend.forward(cache, list(range(1, 100)))  # 99 positions: 4 blocks of 32
    assert pool.capacity - pool.free == 4
    backend.crop(cache, 40)  # 2 blocks cover 40 positions
    assert pool.capacity - pool.free == 2
    del cache  # a session evicted or dropped: its blocks go back
    assert pool.free == pool.capacity


def test_paged_rollback_then_refeed_equals_fresh(ir_dir):
    backend = _paged(ir_dir)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 5
    cache = backend.new_cache()
    backend.forward(cache, prompt + [700, 701, 702])  # three rejected drafts
    backend.crop(cache, len(prompt))
    got = backend.forward(cache, [11, 12], keep_last=2)
    want = backend.forward(backend.new_cache(), prompt + [11, 12], keep_last=2)
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("kind", ["torch", "openvino-paged"])
def test_warm_up_runs_every_pass_size_and_leaves_nothing_behind(ir_dir, kind):
    from specdec.runtime.cached_model import CachedModel

    backend = TorchBackend(load(TINY_TARGET)) if kind == "torch" else _paged(ir_dir, blocks=4)
    sizes = []
    forward_batch = backend.forward_batch
    backend.forward_batch = lambda items: sizes.append(
        [len(t) for _, t, _ in items]) or forward_batch(items)
    model = CachedModel(backend)
    try:
        assert model.warm_up(6) > 0
        # a prefill, one pass of each size 1..6, then two sessions in one pass
        assert sizes[1:7] == [[n] for n in range(1, 7)] and len(sizes[-1]) == 2
        assert len(model.store) == 0  # no session was opened in the store
        if kind == "openvino-paged":
            assert backend.pool.free == backend.pool.capacity  # its blocks went back
    finally:
        model.close()


@pytest.mark.parametrize("kind", ["torch", "openvino", "openvino-paged"])
def test_every_backend_meets_the_backend_protocol(ir_dir, kind):
    """specdec.runtime.backend.Backend: every member on every backend, optional ones with
    their defaults, so that nothing probes a backend with getattr."""
    from specdec.runtime.backend import Backend, BackendDefaults
    from specdec.runtime.openvino_backend import OpenVINOBackend

    if kind == "torch":
        backend = TorchBackend(load(TINY_TARGET))
    elif kind == "openvino":
        backend = OpenVINOBackend(ir_dir, "CPU", threads=1, model_id=TINY_TARGET)
    else:
        backend = _paged(ir_dir)
    assert isinstance(backend, Backend) and isinstance(backend, BackendDefaults)
    assert (backend.skip_layers, backend.head_vocab, backend.dynamic_skip) == ((), 0, None)
    assert (backend.kv_pool_bytes > 0) == (kind == "openvino-paged")
    assert backend.inference_precision in ("f32", "bf16", "f16")
