"""The drafters behind one interface (coordinator.drafters): the look-up, the hybrid's
choice, and the draft model's pre-draft bookkeeping. Pure logic: the draft model's
replies are made up, nothing is sent."""

from __future__ import annotations

import grpc
import pytest

from coordinator.drafters.base import LOOKUP, MODEL, NO_DRAFTS, Drafts, Outcome
from coordinator.drafters.costs import Acceptance, LookupSettings
from coordinator.drafters.hybrid import HybridDrafter
from coordinator.drafters.lookup import LookupDrafter
from coordinator.drafters.model import ModelDrafter
from coordinator.drafters.trie import NO_LOOKUP, Lookup, OutputCache
from coordinator.record import LoopStats, Recorder
from coordinator.remote.clients import ItemFailure
from coordinator.remote.view import CacheView
from specdec.metrics import LoopMetrics
from specdec.sampling import SamplingParams
from specdec.v1 import draft_pb2

PROMPT = [10, 11, 12, 13, 14, 15]


def lookup(prompt=PROMPT, request_k=4, **kw) -> LookupDrafter:
    return LookupDrafter(list(prompt), LookupSettings(**kw), request_k=request_k)


def test_the_look_up_follows_the_committed_ids():
    d = lookup(verify_cost=0.0)
    assert not d.propose(PROMPT + [77], 4)
    d.observe(Outcome(PROMPT + [77, 12, 13], NO_DRAFTS, 0))
    drafts = d.propose(PROMPT + [77, 12, 13], 4)
    assert drafts.source == LOOKUP and drafts.tokens == [14, 15, 77, 12, 13]
    assert drafts.probs == [1.0] * 5 and drafts.dists == []  # greedy: no q on the wire


def test_the_look_up_drafts_up_to_its_own_cap_unless_a_loaded_target_lowered_k():
    d = lookup(verify_cost=0.0, max_tokens=8, request_k=2)
    context = PROMPT + [10, 11]
    assert len(d.propose(context, 2)) > 2  # K = the request's: the look-up's own cap
    # K lowered because the draft service is the bottleneck: still its own cap
    assert len(d.propose(context, 1)) > 2
    d.target_loaded = True  # the planner: a verified draft is dear
    assert len(d.propose(context, 1)) == 1
    assert len(d.propose(context, 2)) > 2  # the request's K: its own cap whatever the load


def test_the_look_up_sends_fewer_drafts_for_weak_matches_and_learns():
    d = lookup()
    context = PROMPT + [77, 12, 13]
    d.observe(Outcome(context, NO_DRAFTS, 0))
    first = d.find(context, 4)
    assert first.match_len == 2 and first.tokens == [14, 15]  # a = 0.5: two drafts pay
    for _ in range(10):
        d.find(context, 4)
        d.observe(Outcome(context, Drafts([14], source=LOOKUP), 1))
    assert d.find(context, 4).tokens == [14, 15, 77, 12]  # learnt: all of them pay
    for _ in range(100):
        d.find(context, 4)
        d.observe(Outcome(context, Drafts([14, 15, 77], source=LOOKUP), 0))
    assert d.find(context, 4) == NO_LOOKUP  # learnt: none pays


def test_a_finished_output_joins_its_tenants_cache():
    cache = OutputCache(per_tenant=4, depth=8)
    settings = LookupSettings(verify_cost=0.0)
    d = LookupDrafter([1, 2], settings, cache=cache, tenant="alice", request_k=4)
    d.observe(Outcome([1, 2, 40, 41, 42, 43], NO_DRAFTS, 0))
    d.finished()
    assert cache.draft("alice", [9, 40, 41], 2, 8, 0.1).tokens == [42, 43]
    again = LookupDrafter([5, 6, 40, 41], settings, cache=cache, tenant="alice", request_k=4)
    assert again.propose([5, 6, 40, 41], 2).tokens == [42, 43]
    nobody = LookupDrafter([5, 6, 40, 41], settings, cache=cache, tenant=None, request_k=4)
    assert not nobody.propose([5, 6, 40, 41], 2)


class Link:
    """What ModelDrafter needs of a DraftLink, with nothing behind it."""

    def __init__(self):
        self.view, self.replica, self.failures, self.failed = CacheView(), "draft-0", 0, []

    def ready(self):
        return True

    def plan(self, committed):
        from coordinator.remote.link import Link as Real

        return Real.plan(self, committed)

    session_id = "s"

    def failed_with(self, code, message):
        self.failed.append(code)
        self.view.forget()


def model(k_max=16) -> ModelDrafter:
    record = Recorder(LoopStats(), LoopMetrics(), 4)
    return ModelDrafter(Link(), SamplingParams(), record, k_max)


def reply(tokens, cached_len):
    return draft_pb2.ProposeResponse(tokens=tokens, cached_len=cached_len)


def test_a_pre_draft_is_used_when_its_assumption_held():
    d = model()
    context = [1, 2, 3]
    pre = d.prepare(context, NO_DRAFTS, 3)  # nothing drafted this round: lead with a guess
    assert pre.lead == 1 and pre.request.num_tokens == 4 and pre.guess
    assert list(pre.request.new_tokens) == context  # a cold session: all of it
    # the draft guessed 9 for the target's token, then drafted 20, 21 and guessed 22
    d.observe(Outcome(context + [9], NO_DRAFTS, 0, reply([9, 20, 21, 22], 6)))
    drafts = d.propose(context + [9], 3)
    assert drafts.tokens == [20, 21] and drafts.guess == 22 and drafts.pipelined
    assert d.link.view.tokens == context + [9, 20, 21]  # what the reply says it holds


def test_a_pre_draft_whose_assumption_failed_is_thrown_away():
    d = model()
    context = [1, 2, 3]
    d.prepare(context, NO_DRAFTS, 3)
    d.observe(Outcome(context + [8], NO_DRAFTS, 0, reply([9, 20, 21, 22], 6)))
    assert d.propose(context + [8], 3) == NO_DRAFTS
    assert d.record.stats.predrafts_wasted == 1


def test_a_context_that_went_on_along_the_pre_draft_uses_the_rest():
    """A structured output's forced tokens, committed without a pass, are the
    pre-draft's own first tokens (the draft's mask forced them too): the rest are used."""
    d = model()
    context = [1, 2, 3]
    d.prepare(context, NO_DRAFTS, 4)
    d.observe(Outcome(context + [9, 20], NO_DRAFTS, 0, reply([9, 20, 21, 22, 23], 7)))
    drafts = d.propose(context + [9, 20], 3)
    assert drafts.tokens == [21, 22] and drafts.guess == 23
    d.prepare(context, NO_DRAFTS, 4)
    d.observe(Outcome(context + [9, 30], NO_DRAFTS, 0, reply([9, 20, 21, 22, 23], 7)))
    assert d.propose(context + [9, 30], 3) == NO_DRAFTS  # went on elsewhere


def test_after_model_drafts_the_pre_draft_assumes_them_and_the_guess():
    d = model()
    drafts = Drafts([20, 21], source=MODEL, guess=22)
    pre = d.prepare([1, 2, 3], drafts, 2)
    assert pre.lead == 0 and pre.assumed == [1, 2, 3, 20, 21, 22]
    assert pre.request.num_tokens == 3  # two drafts and a guess at the next bonus


def test_a_failed_draft_backs_off_and_a_resync_cuts_the_view():
    d = model()
    d.link.view.holds([1, 2, 3, 4])
    d.prepare([1, 2, 3, 4, 5], NO_DRAFTS, 2)
    d.observe(Outcome([1, 2, 3, 4, 5, 6], NO_DRAFTS, 0,
                      ItemFailure(grpc.StatusCode.FAILED_PRECONDITION, "held 2", 2)))
    assert d.link.view.tokens == [1, 2] and not d.link.failed
    d.prepare([1, 2, 3, 4, 5, 6], NO_DRAFTS, 2)
    d.observe(Outcome([1, 2, 3, 4, 5, 6, 7], NO_DRAFTS, 0,
                      ItemFailure(grpc.StatusCode.UNAVAILABLE, "down", whole=True)))
    assert d.link.failed == [grpc.StatusCode.UNAVAILABLE] and d.link.view.tokens == []


def hybrid(**kw) -> HybridDrafter:
    return HybridDrafter(model(), lookup(**kw), LookupSettings(**kw))


def test_the_hybrid_uses_a_long_match_while_the_models_acceptance_is_unknown():
    d = hybrid(min_match=3)
    assert d.choose(Lookup([1], 3, 0.1), False) == LOOKUP
    assert d.choose(Lookup([1, 2, 3], 2, 2.9), False) == MODEL  # a short match
    assert d.choose(Lookup([1], 3, 0.1), True) == MODEL  # keep the pipeline's chain


def test_the_hybrid_compares_expected_tokens_per_cost():
    d = hybrid(min_match=5, verify_cost=0.1, ready_round_cost=2.0, fresh_round_cost=3.0)
    d.observe(Outcome([1], Drafts([5, 6, 7, 8], source=MODEL), 3))
    assert d.model_accepted == pytest.approx(3.0)
    # The model must Propose first: 4 tokens for 3.0 (1.33 a unit) against, for a
    # look-up of 4 drafts, (1 + expected) / 1.4.
    assert d.choose(Lookup([1, 2, 3, 4], 2, 0.9), False) == LOOKUP
    assert d.choose(Lookup([1, 2, 3, 4], 2, 0.8), False) == MODEL
    # Ready model drafts: 4 tokens for 2.0; the look-up also pays for the chain it
    # breaks when a draft is rejected, (3 - 2) (1 - a^4).
    a = Acceptance().rate(8)
    need = 2.0 * (1.4 + 1 - a ** 4) - 1  # expected accepted drafts to tie
    assert d.choose(Lookup([1, 2, 3, 4], 8, need + 0.01), True) == LOOKUP
    assert d.choose(Lookup([1, 2, 3, 4], 8, need - 0.01), True) == MODEL
    assert d.choose(Lookup([1, 2, 3, 4], 8, need - 0.01), False) == LOOKUP
