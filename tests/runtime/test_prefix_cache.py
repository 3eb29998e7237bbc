"""Automatic prefix caching on the paged OpenVINO backend, with the tiny model: a session
served cached blocks returns the logits a cache-off backend computes for the whole
prompt (same argmax, close values), and the session store's bookkeeping is as if every
token had been fed.

Block size 32 (the CPU plugin's): a 100-token prompt has 3 full blocks.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdec import digest
from specdec.errors import FailedPrecondition
from specdec.runtime.models import TINY_TARGET
from specdec.runtime.openvino_export import export_tiny
from specdec.runtime.openvino_paged import PagedOpenVINOBackend

TOL = 1e-4  # f32, as tests/runtime/test_batched_forward.py
PROMPT = [(7 * i + 3) % 690 + 1 for i in range(100)]


@pytest.fixture(scope="module")
def ir_dir(tmp_path_factory):
    return export_tiny(TINY_TARGET, "fp32", tmp_path_factory.mktemp("home"))


def _paged(ir_dir, prefix_cache=True, **kw):
    return PagedOpenVINOBackend(ir_dir, "CPU", threads=1, model_id=TINY_TARGET,
                                prefix_cache=prefix_cache, **kw)


@pytest.fixture(scope="module")
def off(ir_dir):
    return _paged(ir_dir, prefix_cache=False)


def _full(off, tokens, keep_last=1):
    """What a full prefill of `tokens` returns (prefix cache off)."""
    return off.forward(off.new_cache(), tokens, keep_last)


def _same(got, want):
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def test_repeat_prompt_is_served_from_the_cache_with_the_same_logits(ir_dir, off):
    on = _paged(ir_dir)
    first = on.forward(on.new_cache(), PROMPT)
    assert on.prefix_cache_stats.hits == 0
    cache = on.new_cache()
    again = on.forward(cache, PROMPT)
    s = on.prefix_cache_stats
    assert (s.lookups, s.hits, s.hit_tokens, s.cached_blocks) == (2, 1, 96, 3)
    want = _full(off, PROMPT)
    _same(first, want)
    _same(again, want)
    ref, ids = off.new_cache(), []
    off.forward(ref, PROMPT)
    for _ in range(40):  # greedy decode past two more block ends, both alike
        token = int(again[-1].argmax())
        ids.append(token)
        again = on.forward(cache, [token])
        _same(again, off.forward(ref, [token]))
    assert cache.length == len(PROMPT) + 40 and cache.held.tokens == PROMPT + ids


def test_asked_logits_are_never_served(ir_dir, off):
    on = _paged(ir_dir)
    on.forward(on.new_cache(), PROMPT)
    got = on.forward(on.new_cache(), PROMPT, keep_last=len(PROMPT))  # prompt logprobs
    assert on.prefix_cache_stats.hit_tokens == 0
    _same(got, _full(off, PROMPT, len(PROMPT)))
    got = on.forward(on.new_cache(), PROMPT, keep_last=40)  # 60 may be served: 1 block
    assert on.prefix_cache_stats.hit_tokens == 32
    _same(got, _full(off, PROMPT, 40))


def test_partial_block_boundaries(ir_dir, off):
    on = _paged(ir_dir)
    on.forward(on.new_cache(), PROMPT)
    got = on.forward(on.new_cache(), PROMPT[:64])  # the 64th token is computed: 1 block
    assert on.prefix_cache_stats.hit_tokens == 32
    _same(got, _full(off, PROMPT[:64]))
    got = on.forward(on.new_cache(), PROMPT[:65])
    assert on.prefix_cache_stats.hit_tokens == 32 + 64
    _same(got, _full(off, PROMPT[:65]))
    # A session holding 40 tokens of its own (block 1 half full) is given blocks 1, 2.
    cache = on.new_cache()
    on.forward(cache, PROMPT[:40])  # block 0 served
    got = on.forward(cache, PROMPT[40:], keep_last=3)
    assert on.prefix_cache_stats.hit_tokens == 96 + 32 + 56
    _same(got, _full(off, PROMPT, 3))


def test_crop_into_a_shared_block_copies_it(ir_dir, off):
    on = _paged(ir_dir)
    a, b = on.new_cache(), on.new_cache()
    on.forward(a, PROMPT)
    on.forward(b, PROMPT)
    assert b.blocks[:3] == a.blocks[:3]
    on.crop(b, 50)  # into block 1: shared with a and indexed
    got_b = on.forward(b, [5, 6, 7, 8], keep_last=4)
    assert b.blocks[1] != a.blocks[1] and b.blocks[0] == a.blocks[0]
    _same(got_b, _full(off, PROMPT[:50] + [5, 6, 7, 8], 4))
    _same(on.forward(a, [9]), _full(off, PROMPT + [9]))  # a's block 1 untouched
    # The indexed copy is still right for a newcomer.
    _same(on.forward(on.new_cache(), PROMPT[:70]), _full(off, PROMPT[:70]))


def test_least_recently_used_blocks_are_evicted_under_max_blocks(ir_dir, off):
    on = _paged(ir_dir, initial_blocks=4, max_blocks=4)
    a = on.new_cache()
    on.forward(a, PROMPT)  # 3 full blocks and a partial one
    del a
    assert (on.pool.free, on.pool.cached) == (4, 3)
    other = [t + 1 for t in PROMPT[:70]]
    on.forward(on.new_cache(), other)  # 3 blocks: the free one, then 2 evicted
    s = on.prefix_cache_stats
    assert (s.evictions, on.pool.capacity) == (2, 4)
    got = on.forward(on.new_cache(), PROMPT)
    assert on.prefix_cache_stats.hit_tokens == 32  # block 0 was used last: kept
    _same(got, _full(off, PROMPT))
    held = [on.new_cache() for _ in range(2)]
    on.forward(held[0], PROMPT[:64])
    with pytest.raises(MemoryError):  # held blocks are never evicted
        on.forward(held[1], other)
    assert held[1].length == 0 and held[0].length == 64


def test_sessions_sharing_a_prefix_in_one_pass(ir_dir, off):
    on = _paged(ir_dir)
    other = [t + 2 for t in PROMPT]
    caches = [on.new_cache() for _ in range(3)]
    got = on.forward_batch([(caches[0], PROMPT, 1), (caches[1], PROMPT, 2),
                            (caches[2], other, 1)])
    _same(got[0], _full(off, PROMPT))
    _same(got[1], _full(off, PROMPT, 2))
    _same(got[2], _full(off, other))
    assert on.prefix_cache_stats.cached_blocks == 6  # one copy of each prefix indexed
    # Next pass: two newcomers served the same blocks, beside decode steps of the others.
    d, e = on.new_cache(), on.new_cache()
    tail = PROMPT[:40] + [11, 12, 13]
    got = on.forward_batch([(d, PROMPT + [1, 2], 3), (caches[0], [4], 1), (e, tail, 2),
                            (caches[2], [5], 1)])
    assert on.prefix_cache_stats.hit_tokens == 96 + 32
    assert d.blocks[0] == e.blocks[0] == caches[0].blocks[0]
    _same(got[0], _full(off, PROMPT + [1, 2], 3))
    _same(got[1], _full(off, PROMPT + [4]))
    _same(got[2], _full(off, tail, 2))
    _same(got[3], _full(off, other + [5]))


def test_random_script_equals_a_cache_off_backend(ir_dir, off):
    """Sessions starting from shared stems, rolled back and fed on, several per pass:
    every logit row as the cache-off backend's, every table holding its own tokens."""
    rng = random.Random(5)
    on = _paged(ir_dir, initial_blocks=8, max_blocks=24)
    stems = [PROMPT[:n] for n in (33, 70, 100)] + [[t + 3 for t in PROMPT[:64]]]
    pairs = [(on.new_cache(), off.new_cache()) for _ in range(4)]
    for _ in range(40):
        items = []
        for mine, ref in rng.sample(pairs, rng.randrange(1, 4)):
            if mine.length and rng.random() < 0.3:
                cut = rng.randrange(mine.length)
                on.crop(mine, cut)
                off.crop(ref, cut)
            if mine.length > 120 or rng.random() < 0.2:  # a new request on it
                on.crop(mine, 0)
                off.crop(ref, 0)
            tokens = [rng.randrange(1, 700) for _ in range(rng.choice([1, 2, 5]))]
            if not mine.length:
                tokens = rng.choice(stems) + tokens
            items.append((mine, ref, tokens, rng.randrange(1, len(tokens) + 1)))
        got = on.forward_batch([(m, t, k) for m, _, t, k in items])
        for (mine, ref, tokens, keep), logits in zip(items, got, strict=True):
            _same(logits, off.forward(ref, tokens, keep))
            assert mine.held.tokens == ref.held.tokens and mine.length == ref.length
    s = on.prefix_cache_stats
    print("random script:", s)
    assert s.hits > 5 and s.evictions > 0


def test_cache_sync_rule_is_unchanged(ir_dir, off):
    """Through CachedModel: a hit leaves the session's tokens, digests and cached_len as a
    full feed would; a wrong promise is still FAILED_PRECONDITION."""
    from specdec.runtime.cached_model import CachedModel
    from specdec.sync import SyncRequest

    model = CachedModel(_paged(ir_dir))
    try:
        for sid in ("a", "b"):
            args = SyncRequest(sid, 0, 0, PROMPT)
            with model.store.use(sid, 0, 0) as s:
                logits = model.sync(s, args, keep_last=1)
            _same(logits, _full(off, PROMPT))
        assert model.backend.prefix_cache_stats.hit_tokens == 96
        s, _ = model.store.peek("b")
        assert s.tokens == PROMPT and s.cached_len == 100
        assert s.prefix == [0, *digest.prefix_digests(PROMPT)]
        with pytest.raises(FailedPrecondition):
            model.store.checkout("b", 50, digest.digest(PROMPT[:49] + [0]))
        keep = digest.digest(PROMPT[:50])
        with model.store.use("b", 50, keep) as s:  # crop into the shared block, feed on
            logits = model.sync(s, SyncRequest("b", 50, keep, [3, 4]), keep_last=2)
        _same(logits, _full(off, PROMPT[:50] + [3, 4], 2))
        assert s.cached_len == 52 == s.cache.length and s.tokens == s.cache.held.tokens
    finally:
        model.close()


def test_metrics_report_the_prefix_cache(ir_dir):
    from prometheus_client import generate_latest

    from specdec.metrics import PrometheusModelMetrics

    on = _paged(ir_dir)
    metrics = PrometheusModelMetrics("target")
    metrics.track_prefix_cache(lambda: on.prefix_cache_stats)
    on.forward(on.new_cache(), PROMPT)
    on.forward(on.new_cache(), PROMPT)
    text = generate_latest(metrics.registry).decode()
    for line in ("specdec_target_prefix_cache_lookups_total 2.0",
                 "specdec_target_prefix_cache_hits_total 1.0",
                 "specdec_target_prefix_cache_hit_tokens_total 96.0",
                 "specdec_target_prefix_cache_blocks 3.0",
                 "specdec_target_prefix_cache_evictions_total 0.0"):
        assert line in text.splitlines()
    off_metrics = PrometheusModelMetrics("draft")
    off_metrics.track_prefix_cache(lambda: None)  # no prefix cache: nothing reported
    assert "prefix_cache" not in generate_latest(off_metrics.registry).decode()


def test_target_service_serves_a_repeated_prompt_from_the_cache(tmp_path, monkeypatch):
    """Through the real gRPC target service (paged OpenVINO, its default layout): a second
    session with the same prompt is served its blocks and answers as the first; prompt
    logprobs (every fed position asked for) are never served from the cache."""
    import grpc

    from specdec.v1 import common_pb2, target_pb2, target_pb2_grpc
    from target_service.__main__ import create
    from target_service.config import TargetConfig

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    server, port, engine = create(TargetConfig(model="tiny-random", backend="openvino",
                                               port=0, warmup=False))
    server.start()
    try:
        stub = target_pb2_grpc.TargetServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

        def verify(sid, prompt_logprobs=False):
            return stub.Verify(target_pb2.VerifyRequest(
                session_id=sid, keep_len=0, keep_digest=0, new_tokens=PROMPT,
                sampling=common_pb2.SamplingParams(), round_seed=1, logprobs=2,
                prompt_logprobs=prompt_logprobs))

        backend = engine.model.backend
        first, again = verify("a"), verify("b")
        assert backend.prefix_cache_stats.hit_tokens == 96
        assert (again.bonus_token, again.cached_len) == (first.bonus_token, 100)
        want = [(e.token_ids, e.logprobs) for e in first.logprobs]
        for (ids, got), (want_ids, want_lp) in zip(
                [(e.token_ids, e.logprobs) for e in again.logprobs], want, strict=True):
            assert list(ids) == list(want_ids)
            assert got == pytest.approx(want_lp, abs=TOL)
        full, cached = verify("c", True), verify("d", True)
        assert backend.prefix_cache_stats.hit_tokens == 96
        assert len(cached.prompt_logprobs) == len(full.prompt_logprobs) == 99
        assert [v for e in cached.prompt_logprobs for v in e.logprobs] == pytest.approx(
            [v for e in full.prompt_logprobs for v in e.logprobs], abs=TOL)
    finally:
        server.stop(0)
        engine.model.close()
