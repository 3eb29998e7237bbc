"""The lockstep engine without gRPC: real engines on the tiny models, called in process
(tests/loop/inprocess.py), behind the coordinator's client interface."""

from __future__ import annotations

import threading

import grpc
import pytest

from coordinator.loop import LoopStats, SpeculativeLoop
from coordinator.loop.generation import PREFILL_CHUNK
from coordinator.loop.policy import LoopPolicy
from coordinator.remote.clients import ItemFailure
from coordinator.remote.routing import Router
from specdec.errors import InvalidArgument
from specdec.sampling import SamplingParams
from tests.loop.inprocess import DraftInProcess, TargetInProcess, draft_engine, target_engine

GREEDY = SamplingParams()
PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99], [42], [5, 6, 7, 8, 9, 10, 11], [300, 301],
           [17, 17, 17, 17], [600, 2, 600, 2, 600], [123]]


@pytest.fixture(scope="module")
def engines():
    return draft_engine(), target_engine()


@pytest.fixture(scope="module")
def expected(engines):
    """Each prompt's target-only greedy output, alone."""
    _, target = engines
    loop = SpeculativeLoop(None, TargetInProcess(target))
    try:
        return {tuple(p): loop.generate(p, 40, GREEDY, 0).token_ids for p in PROMPTS}
    finally:
        loop.close()


def run_all(loop, prompts, k=4, n=40, stats=None):
    """Every prompt's generation at once, each in its own thread; their outputs."""
    out: list = [None] * len(prompts)

    def one(i):
        try:
            out[i] = loop.generate(prompts[i], n, GREEDY, k).token_ids
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "sequential"])
def test_concurrent_greedy_outputs_equal_target_only_alone(engines, expected, pipeline):
    draft, target = DraftInProcess(engines[0]), TargetInProcess(engines[1])
    loop = SpeculativeLoop(draft, target, LoopPolicy(pipeline=pipeline, drafter="model"))
    try:
        outs = run_all(loop, PROMPTS)
    finally:
        loop.close()
    assert outs == [expected[tuple(p)] for p in PROMPTS]
    # Lockstep: most steps verify several generations in one call, and draft them in one
    assert max(target.calls) > 1 and max(draft.calls) > 1
    assert sum(target.calls) / len(target.calls) > 2
    assert len(engines[0].model.store) == len(engines[1].model.store) == 0


def test_a_refused_round_fails_its_generation_alone(engines, expected):
    """A prompt id outside the vocabulary: the target refuses that item of the batch
    (INVALID_ARGUMENT); the generation fails with it, the others finish, exact."""
    loop = SpeculativeLoop(DraftInProcess(engines[0]), TargetInProcess(engines[1]),
                           LoopPolicy(drafter="model"))
    bad = [1, 2, 10_000]
    try:
        outs = run_all(loop, PROMPTS[:4] + [bad])
    finally:
        loop.close()
    assert outs[:4] == [expected[tuple(p)] for p in PROMPTS[:4]]
    assert isinstance(outs[4], InvalidArgument) and "outside the vocabulary" in str(outs[4])


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE])
def test_a_failing_draft_costs_drafts_not_output(engines, expected, code):
    """Every third ProposeBatch fails as a whole: the generations of that step have no
    model drafts for a while (UNAVAILABLE also backs the replica off), never other
    tokens."""
    calls = []

    def every_third(items):
        calls.append(len(items))
        return ItemFailure(code, "injected", whole=True) if len(calls) % 3 == 0 else None

    loop = SpeculativeLoop(DraftInProcess(engines[0], fail=every_third),
                           TargetInProcess(engines[1]), LoopPolicy(drafter="model"),
                           draft_backoff_s=0.0)
    stats = LoopStats()
    try:
        rounds = loop.rounds(PROMPTS[0], 40, GREEDY, 4, stats=stats)
        first = next(rounds).tokens
        outs = run_all(loop, PROMPTS[1:4])
        ids = first + [t for out in rounds for t in out.tokens]
    finally:
        loop.close()
    assert outs == [expected[tuple(p)] for p in PROMPTS[1:4]]
    assert ids == expected[tuple(PROMPTS[0])]
    assert stats.draft_fallbacks > 0 and stats.drafted_tokens > 0


def test_a_target_replica_that_fails_is_replaced_and_rounds_repeated(engines, expected):
    calls = []

    def down_after_two(items):
        calls.append(len(items))
        return ItemFailure(grpc.StatusCode.UNAVAILABLE, "down", whole=True) \
            if len(calls) > 2 else None

    first = TargetInProcess(target_engine(), fail=down_after_two)
    second = TargetInProcess(engines[1])
    target = Router.from_clients({"t-a": first, "t-b": second})
    loop = SpeculativeLoop(DraftInProcess(engines[0]), target, LoopPolicy(drafter="model"))
    stats = LoopStats()
    try:
        ids = [t for out in loop.rounds(PROMPTS[1], 40, GREEDY, 4, stats=stats)
               for t in out.tokens]
    finally:
        loop.close()
    assert ids == expected[tuple(PROMPTS[1])]
    assert stats.target_repins == 1 and stats.target_replicas == ["t-a", "t-b"]


def test_a_consumer_that_leaves_frees_its_sessions_and_the_others_go_on(engines, expected):
    loop = SpeculativeLoop(DraftInProcess(engines[0]), TargetInProcess(engines[1]),
                           LoopPolicy(drafter="model"))
    try:
        rounds = loop.rounds(PROMPTS[2], 40, GREEDY, 4)
        first = next(rounds)
        others = run_all(loop, PROMPTS[3:6])
        rounds.close()  # the client went away after one round
        assert first.tokens
        assert others == [expected[tuple(p)] for p in PROMPTS[3:6]]
        assert len(engines[0].model.store) == len(engines[1].model.store) == 0
    finally:
        loop.close()


def test_a_long_prompt_is_prefilled_over_several_steps(engines):
    """A prompt longer than PREFILL_CHUNK feeds the target a chunk a step (the others'
    rounds are not held up by one long pass); the output is the same."""
    prompt = [(7 * i) % 700 + 3 for i in range(2 * PREFILL_CHUNK + 40)]
    target = TargetInProcess(engines[1])
    loop = SpeculativeLoop(DraftInProcess(engines[0]), target, LoopPolicy(drafter="model"))
    base = SpeculativeLoop(None, TargetInProcess(target_engine()))
    try:
        fast = loop.generate(prompt, 12, GREEDY, 4)
        plain = base.generate(prompt, 12, GREEDY, 0)
    finally:
        loop.close()
        base.close()
    assert fast.token_ids == plain.token_ids
    assert len(target.calls) == 2 + fast.stats.rounds  # two chunks before round 1


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "sequential"])
def test_every_item_s_bytes_are_counted_once(engines, pipeline):
    """A generation's bytes_sent / bytes_received are its items' serialized sizes over
    every Propose and Verify it made: pre-drafts, drafts fetched before a Verify (every
    round's when sequential), and Verifies."""
    draft, target = DraftInProcess(engines[0]), TargetInProcess(engines[1])
    sizes = {"sent": 0, "received": 0}

    def counting(batch):
        def call(items):
            done = batch(items)
            sizes["sent"] += sum(i.ByteSize() for i in items)
            sizes["received"] += sum(o.ByteSize() for o in done.outcomes(None)
                                     if not isinstance(o, ItemFailure))
            return done
        return call

    draft.propose_batch = counting(draft.propose_batch)
    target.verify_batch = counting(target.verify_batch)
    loop = SpeculativeLoop(draft, target, LoopPolicy(pipeline=pipeline, drafter="model"))
    try:
        stats = loop.generate(PROMPTS[0], 24, GREEDY, 4).stats
    finally:
        loop.close()
    assert stats.drafted_tokens > 0
    assert (stats.bytes_sent, stats.bytes_received) == (sizes["sent"], sizes["received"])


@pytest.mark.parametrize("fetch_drafts", [1, 4])
def test_a_missed_pre_draft_fetches_the_planners_size(engines, expected, monkeypatch,
                                                      fetch_drafts):
    """Pipelined, a round whose pre-draft missed fetches the planner's size for the step
    (its fetch_drafts, or the whole K where the model says so; its pre-draft for the
    next round is still sized K); the output is the target's either way."""
    from coordinator.loop import calls

    draft, target = DraftInProcess(engines[0]), TargetInProcess(engines[1])
    loop = SpeculativeLoop(draft, target, LoopPolicy(pipeline=True, drafter="model"))
    loop.planner.fetch_drafts = fetch_drafts
    fetched = []
    fetch = calls.fetch

    def recording(gens, ks, guess=False):
        fetched.append((list(ks), loop.planner.fetch_now))
        return fetch(gens, ks, guess)

    monkeypatch.setattr(calls, "fetch", recording)
    try:
        outs = [loop.generate(p, 40, GREEDY, 4) for p in PROMPTS[:4]]
    finally:
        loop.close()
    assert [o.token_ids for o in outs] == [expected[tuple(p)] for p in PROMPTS[:4]]
    assert fetched  # a miss happened, and was fetched for
    assert all(len(ks) == 1 and ks[0] <= size for ks, size in fetched)
    if fetch_drafts == 4:
        assert max(ks[0] for ks, _ in fetched) == 4
    assert sum(o.stats.drafted_tokens for o in outs) > 0
