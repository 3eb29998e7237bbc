"""The draft-side confidence exit: the draft stops a round once it is unsure.

On the wire (Propose.exit_below) and through the loop, alone and with pipelining and
adaptive K: it changes how many tokens a round drafts, never which tokens come out.
"""

from __future__ import annotations

import grpc
import pytest

from coordinator.loop import LoopStats, SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.sampling import SamplingParams
from specdec.v1 import common_pb2
from tests.service.conftest import GREEDY, SAMPLED, propose_req

PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99], [42]]


def propose(stub, session, exit_below, sampling=GREEDY, k=6):
    req = propose_req(session, [31, 415, 92, 65], k=k, sampling=sampling)
    req.exit_below = exit_below
    try:
        return stub.Propose(req, timeout=30)
    finally:  # the servers are shared by the whole test session
        stub.Release(common_pb2.ReleaseRequest(session_id=session), timeout=30)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_exit_cuts_the_proposal_to_a_prefix(draft_stub, sampling):
    full = propose(draft_stub, "ce-full", 0.0, sampling)
    assert len(full.tokens) == 6
    # The tiny random draft is never sure of anything (probabilities ~0.1): an exit at
    # 0.99 stops after the first token, which is still returned; the cache holds only
    # the prefix (the returned token is not fed).
    cut = propose(draft_stub, "ce-cut", 0.99, sampling)
    assert list(cut.tokens) == list(full.tokens[:1])
    assert cut.cached_len == 4
    assert len(cut.dists) == (1 if sampling is SAMPLED else 0)
    # A threshold between the draft's confidences cuts somewhere in between, always
    # a prefix of what it would have proposed (same state, same seed).
    for threshold in (0.02, 0.05, 0.1):
        mid = propose(draft_stub, f"ce-{threshold}", threshold, sampling)
        assert 1 <= len(mid.tokens) <= 6
        assert list(mid.tokens) == list(full.tokens[:len(mid.tokens)])
        assert mid.cached_len == 4 + len(mid.tokens) - 1


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_out_of_range_threshold_is_invalid_argument(draft_stub, bad):
    with pytest.raises(grpc.RpcError) as err:
        propose(draft_stub, "ce-bad", bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exit_below" in err.value.details()


def run(loop, prompt, params, k, n=48):
    stats = LoopStats()
    ids = [t for out in loop.rounds(prompt, n, params, k, stats=stats) for t in out.tokens]
    return ids, stats


MODES = {
    "sequential": dict(pipeline=False),
    "pipelined": dict(pipeline=True),
    "pipelined-adaptive": dict(pipeline=True, adaptive_k=True),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_with_confidence_exit_equals_target_only(draft_client, target_client, mode,
                                                        prompt):
    base, _ = run(SpeculativeLoop(None, target_client), prompt, SamplingParams(), 0)
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(drafter="model",
        confidence_exit=True, exit_threshold=0.3, **MODES[mode]))
    ids, stats = run(loop, prompt, SamplingParams(), 4)
    assert ids == base
    assert all(0 <= k <= 4 for k in stats.k_per_round)
    assert stats.drafted_tokens == sum(stats.k_per_round)
    if mode == "pipelined-adaptive":
        return  # the planner may find drafting does not pay on the tiny pair: exactness
    assert stats.confidence_exits > 0  # the unsure tiny draft cut rounds short...
    assert min(k for k in stats.k_per_round if k) < 4  # ...to fewer than K drafts


def test_threshold_follows_acceptance_in_a_generation(draft_client, target_client):
    """Starting high, the tiny pair's acceptance (above the 0.5 aimed for) brings the
    threshold down, so later rounds draft more tokens than the first ones."""
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(drafter="model",
        pipeline=False, confidence_exit=True, exit_threshold=0.9, exit_target_acceptance=0.5))
    _, stats = run(loop, [1, 2, 3, 4, 5], SamplingParams(), 4, n=96)
    assert stats.accepted_tokens / stats.drafted_tokens > 0.5
    ks = [k for k in stats.k_per_round if k]
    assert ks[:3] == [1, 1, 1]  # every first-token confidence is below 0.9
    assert max(ks[len(ks) // 2:]) > 1


@pytest.mark.parametrize("seed", range(4))
def test_seeded_sampled_output_is_reproducible_with_exit(draft_client, target_client, seed):
    params = SamplingParams(temperature=1.0, top_k=8, seed=seed)
    outs = []
    for pipeline in (False, True, True):
        loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(drafter="model",
            pipeline=pipeline, confidence_exit=True, exit_threshold=0.2))
        outs.append(run(loop, PROMPTS[seed % 3], params, 3))
    (_, sa), (b, sb), (c, _) = outs
    assert b == c  # pipelined twice: same tokens whatever the timing
    assert sa.confidence_exits > 0 and sb.confidence_exits > 0


def test_a_called_off_propose_stops_early_and_leaves_the_session_usable(draft_server):
    """Cancellation (a pre-draft nobody needs) is checked before each draft step."""
    from draft_service.engine import ProposeArgs
    from specdec import digest

    engine = draft_server[1]
    prefix = [31, 415, 92, 65]
    steps = iter(range(100))
    args = ProposeArgs(session_id="ce-cancel", keep_len=0, keep_digest=digest.digest([]),
                       new_tokens=prefix, num_tokens=8)
    try:
        cut = engine.propose(args, cancelled=lambda: next(steps) >= 3)  # 1 entry + 2 steps
        assert len(cut.tokens) == 3 and cut.cached_len == len(prefix) + 2
        # The session holds what was fed: a follow-up keeps all of it.
        held = prefix + cut.tokens[:2]
        more = engine.propose(ProposeArgs(session_id="ce-cancel", keep_len=len(held),
                                          keep_digest=digest.digest(held),
                                          new_tokens=[cut.tokens[2]], num_tokens=2))
        full = engine.propose(ProposeArgs(session_id="ce-cancel", keep_len=0,
                                          keep_digest=digest.digest([]), new_tokens=prefix,
                                          num_tokens=5))
        assert cut.tokens + more.tokens == full.tokens  # greedy: same continuation
    finally:
        engine.release("ce-cancel")


def test_a_request_called_off_before_it_starts_leaves_the_session_alone(draft_server):
    from draft_service.engine import ProposeArgs
    from specdec import digest
    from specdec.errors import Cancelled

    engine = draft_server[1]
    args = ProposeArgs(session_id="ce-early", keep_len=0, keep_digest=digest.digest([]),
                       new_tokens=[1, 2, 3], num_tokens=4)
    with pytest.raises(Cancelled):
        engine.propose(args, cancelled=lambda: True)
    assert not engine.release("ce-early")  # never created
