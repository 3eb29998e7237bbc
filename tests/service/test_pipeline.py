"""Pipelined drafting: the draft works on round r+1 while the target verifies round r.

Only verification decides tokens, and the draft is deterministic given its prefix, so a
greedy pipelined generation must emit exactly the target-only tokens, and a sampled one
the same tokens for the same seed whatever the timing (its law is checked by the
chi-square tests in test_sampled_distribution.py).
"""

from __future__ import annotations

import time

import pytest

from coordinator.loop import LoopStats, SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.sampling import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99], [42]]


@pytest.fixture()
def loops(draft_client, target_client):
    return (SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False)),
            SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=True)))


def run(loop, prompt, params, k, n=48):
    stats = LoopStats()
    ids = [t for out in loop.rounds(prompt, n, params, k, stats=stats) for t in out.tokens]
    return ids, stats


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [1, 4])
def test_pipelined_greedy_equals_target_only(loops, prompt, k, draft_server):
    sequential, pipelined = loops
    base, _ = run(sequential, prompt, SamplingParams(), 0)
    ids, stats = run(pipelined, prompt, SamplingParams(), k)
    assert ids == base
    assert stats.pipelined_rounds > 0  # some pre-drafts were used...
    assert stats.predrafts_wasted > 0  # ...and some thrown away (the tiny draft errs)
    # Every pre-draft was used by the next round or discarded (at the latest when the
    # generation ended); rounds near the end start none (the next could not use it).
    assert stats.pipelined_rounds + stats.predrafts_wasted == stats.predrafts_started
    assert stats.predrafts_started <= stats.rounds - 1
    # Wasted pre-drafts are called off mid-flight; what the loop then assumes the draft
    # holds must be true, or the next Propose would need a resync.
    assert stats.resyncs == 0
    # Round 1 is the target's alone while the draft prefills (both prefills overlap).
    assert stats.k_per_round[0] == 0
    assert len(draft_server[1].model.store) == 0  # sessions released after the last one


@pytest.mark.parametrize("seed", range(6))
def test_pipelined_sampled_output_depends_on_the_seed_only(loops, seed):
    """Pipelined rounds are laid out differently from sequential ones (the first token is
    the target's alone, while the draft prefills), so a seed draws another, equally
    valid sample (the chi-square tests check the law); but always the same one."""
    _, pipelined = loops
    params = SamplingParams(temperature=1.0, top_k=8, seed=seed)
    a, sa = run(pipelined, PROMPTS[seed % 3], params, 3)
    b, sb = run(pipelined, PROMPTS[seed % 3], params, 3)
    assert a == b
    assert (sa.rounds, sa.accepted_tokens) == (sb.rounds, sb.accepted_tokens)
    assert sa.predrafts_started > 0


def test_generation_stats_and_metrics_report_pipelining(draft_server, target_server):
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec.metrics import PrometheusLoopMetrics
    from specdec.v1 import generate_pb2

    service = build_service(CoordinatorConfig(draft=draft_server[0], target=target_server[0],
                                              pipeline=True))
    metrics = PrometheusLoopMetrics()
    service.loop.metrics = metrics

    def req(k):
        return generate_pb2.GenerateRequest(prompt_token_ids=[1, 2, 3, 4, 5], max_new_tokens=48,
                                            num_draft_tokens=k)

    base, piped = service.generate(req(0)), service.generate(req(4))
    assert list(piped.token_ids) == list(base.token_ids)
    assert piped.stats.pipelined_rounds > 0
    assert piped.stats.pipelined_rounds + piped.stats.predrafts_wasted <= piped.stats.rounds
    used = metrics.predrafts.labels("used")._value.get()
    wasted = metrics.predrafts.labels("wasted")._value.get()
    assert used == piped.stats.pipelined_rounds
    assert used + wasted <= piped.stats.rounds - 1


def test_injected_latency_and_jitter_change_timing_not_text(draft_server, target_server):
    """With 20 ms RTT +-10 ms jitter: pipelined rounds overlap (counted in stats), and the
    same seed gives the same text as the pipelined loop without any injected latency."""
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec.v1 import common_pb2, generate_pb2

    def service(**kw):
        return build_service(CoordinatorConfig(draft=draft_server[0], target=target_server[0],
                                               **kw))

    plain = service(pipeline=True)
    slow = service(pipeline=True, inject_rtt_ms=20, inject_jitter_ms=10)
    req = generate_pb2.GenerateRequest(
        prompt_token_ids=[9, 8, 7], max_new_tokens=24, num_draft_tokens=3,
        sampling=common_pb2.SamplingParams(temperature=1.0, top_k=8, seed=11))
    a, b = plain.generate(req), slow.generate(req)
    assert list(a.token_ids) == list(b.token_ids)  # sampled: same seed, same text
    req.sampling.CopyFrom(common_pb2.SamplingParams())  # greedy: guesses hold more often
    a, b = plain.generate(req), slow.generate(req)
    assert list(a.token_ids) == list(b.token_ids)
    assert b.stats.pipelined_rounds > 0  # drafts were ready when Verify returned
    verify_calls = list(slow.loop.target.replicas()[0].client.bytes.recent)
    assert min(c.seconds for c in verify_calls) >= 0.02  # the latency was injected


@pytest.mark.parametrize("pipeline", [False, True])
def test_adaptive_k_greedy_equals_target_only(draft_client, target_client, pipeline):
    loop = SpeculativeLoop(draft_client, target_client,
                           LoopPolicy(pipeline=pipeline, adaptive_k=True), max_propose=16)
    for prompt in PROMPTS:
        base, _ = run(loop, prompt, SamplingParams(), 0, n=64)
        ids, stats = run(loop, prompt, SamplingParams(), 4, n=64)
        assert ids == base
        assert len(stats.k_per_round) == stats.rounds
        # Within [0, max]: the planner leaves drafting out where it does not pay (on the
        # tiny random pair it often does not), a pipelined round whose pre-draft missed
        # has no drafts, and the look-up (the hybrid's) may draft more than K.
        assert all(0 <= k <= 16 for k in stats.k_per_round)


@pytest.fixture(scope="module")
def perfect_draft():
    """A draft service running the target's own model: every guess holds."""
    from draft_service.__main__ import create
    from draft_service.config import DraftConfig

    server, port, _ = create(DraftConfig(model="tiny-random", port=0))
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_a_perfect_draft_pipelines_every_round_after_the_prefill(perfect_draft, target_client):
    """Round 1 is the target's alone while the draft prefills and drafts from the prompt;
    its first token stands for the target's. With the target's own model as the draft
    every guess holds, so every later round uses a pre-draft, round 2 included."""
    import grpc as grpc_

    from coordinator.remote.clients import DraftClient

    with grpc_.insecure_channel(perfect_draft) as channel:
        loop = SpeculativeLoop(DraftClient(channel), target_client, LoopPolicy(pipeline=True))
        base, _ = run(SpeculativeLoop(None, target_client), PROMPTS[0], SamplingParams(), 0)
        ids, stats = run(loop, PROMPTS[0], SamplingParams(), 4)
    assert ids == base
    # Round 2's pre-draft began with its guess at round 1's token (the lead), so it holds
    # K - 1 drafts (every pre-draft takes K + 1 passes); later ones hold K.
    assert stats.k_per_round[:3] == [0, 3, 4]
    assert stats.predrafts_wasted == 0 and stats.rejections == 0
    assert stats.pipelined_rounds == stats.rounds - 1  # every round but the first
    assert stats.pipelined_rounds == stats.predrafts_started


def test_a_stop_string_counts_the_last_pre_draft_in_the_stats(draft_server, target_server):
    """A generation cut by a stop string releases its sessions before its last chunk, so
    the pre-draft still in flight is in the stats that chunk carries (and in metrics)."""
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec.metrics import PrometheusLoopMetrics
    from specdec.v1 import generate_pb2

    service = build_service(CoordinatorConfig(draft=draft_server[0], target=target_server[0],
                                              pipeline=True))
    metrics = PrometheusLoopMetrics()
    service.loop.metrics = metrics
    req = generate_pb2.GenerateRequest(prompt_token_ids=[1, 2, 3, 4, 5], max_new_tokens=48,
                                       num_draft_tokens=4)
    full = service.generate(req)
    stop = full.text[len(full.text) // 2:][:3]
    req.stop.append(stop)

    def counts():
        return (metrics.predrafts.labels("used")._value.get(),
                metrics.predrafts.labels("wasted")._value.get())

    before = counts()
    cut = service.generate(req)
    after = counts()
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert (after[0] - before[0], after[1] - before[1]) == \
        (cut.stats.pipelined_rounds, cut.stats.predrafts_wasted)
    assert cut.stats.predrafts_wasted > 0
    assert len(target_server[1].model.store) == 0
    # The draft session goes once the called-off pre-draft ends its current token.
    deadline = time.monotonic() + 10
    while len(draft_server[1].model.store) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(draft_server[1].model.store) == 0
