"""Greedy contrastive decoding over the real services equals, token for token, the
reference computed in this process from the two models' logits with the formula
(specdec_tools.contrastive_reference: Hugging Face models, no cache, nothing shared with the
services' runtime), for both formulations, the plain form (K = 0) and the speculative
form (K > 0), sequential and pipelined, alone, concurrently and after lost sessions."""

from __future__ import annotations

import threading

import pytest

from coordinator.loop import LoopStats, SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.contrastive import LI, OBRIEN
from specdec.sampling import SamplingParams
from tests.service._contrastive_helpers import params, reference
from tests.service.conftest import evict_at

GREEDY = SamplingParams()
PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99]]
N = 24


@pytest.fixture()
def loop(draft_client, target_client):
    return SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False))


@pytest.fixture()
def pipelined(draft_client, target_client):
    return SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=True))


FORMS = [params(OBRIEN), params(LI), params(LI, amateur_temperature=0.5),
         params(OBRIEN, alpha=0.02, beta=1.5)]
FORM_IDS = ["obrien", "li", "li-Ta0.5", "obrien-a0.02-b1.5"]


@pytest.mark.parametrize("p", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize(("k", "pipeline"),
                         [(0, False), (1, False), (4, False), (1, True), (4, True)],
                         ids=["plain", "K1", "K4", "K1-pipelined", "K4-pipelined"])
def test_greedy_equals_the_in_process_reference(loop, pipelined, p, k, pipeline):
    loop = pipelined if pipeline else loop
    for prompt in PROMPTS:
        want = reference(prompt, p)
        result = loop.generate(prompt, N, GREEDY, num_draft_tokens=k, contrastive=p)
        assert result.token_ids == want, (prompt, k)
        stats = result.stats
        assert stats.head_positions >= N and stats.mean_head_size >= 1
        if k:
            assert stats.drafted_tokens > 0 and stats.rounds < N + 1


def test_contrastive_is_not_target_greedy_and_its_limits_are(loop):
    """The test has power: the contrastive choice differs from the target's own greedy
    output on these models; and its two limits are the target's greedy output (beta = 0:
    the expert alone on V_head, whose argmax is always in it; alpha = 1: V_head is the
    argmax alone)."""
    prompt = PROMPTS[0]
    target_only = loop.generate(prompt, N, GREEDY, num_draft_tokens=0).token_ids
    assert reference(prompt, params(OBRIEN)) != target_only
    assert reference(prompt, params(LI)) != target_only
    for p in (params(OBRIEN, beta=0.0), params(LI, alpha=1.0)):
        assert loop.generate(prompt, N, GREEDY, 3, contrastive=p).token_ids == target_only


def test_pipelined_rounds_use_their_pre_drafts_and_give_the_reference(draft_client,
                                                                      target_client):
    """Pre-drafts are used when every draft and the guessed bonus hold, and called off
    otherwise, and the tokens are the reference's; the confidence exit, on in this
    policy, is not used by contrastive rounds. beta = 0.1 keeps the contrast mild, so
    that the tiny draft's guesses hold now and then."""
    loop = SpeculativeLoop(draft_client, target_client,
                           LoopPolicy(pipeline=True, confidence_exit=True))
    p = params(OBRIEN, beta=0.1)
    used = wasted = 0
    for prompt in PROMPTS:
        for k in (1, 2):
            result = loop.generate(prompt, N, GREEDY, num_draft_tokens=k, contrastive=p)
            assert result.token_ids == reference(prompt, p), (prompt, k)
            stats = result.stats
            assert stats.confidence_exits == 0 and stats.resyncs == 0
            assert stats.predrafts_started == stats.pipelined_rounds + stats.predrafts_wasted
            used, wasted = used + stats.pipelined_rounds, wasted + stats.predrafts_wasted
    assert used > 0 and wasted > 0


@pytest.mark.parametrize("pipeline", [False, True], ids=["sequential", "pipelined"])
def test_concurrent_contrastive_and_speculative_generations(loop, pipelined, pipeline):
    """Contrastive and speculative generations share the services' batched passes and
    still each give their own exact output (pipelined: read-only look-ups beside
    pre-drafts in the draft's batched steps)."""
    loop = pipelined if pipeline else loop
    p = params(OBRIEN)
    speculative = {i: loop.generate(pr, N, GREEDY, 0).token_ids for i, pr in enumerate(PROMPTS)}
    jobs = [(i, k, c) for i in range(len(PROMPTS)) for k in (0, 4) for c in (True, False)]
    got: list = []

    def run(i, k, contrastive):
        r = loop.generate(PROMPTS[i], N, GREEDY, k, contrastive=p if contrastive else None)
        got.append((i, contrastive, r.token_ids))

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(got) == len(jobs)
    for i, contrastive, ids in got:
        assert ids == (reference(PROMPTS[i], p) if contrastive else speculative[i])


@pytest.mark.parametrize(("k", "pipeline"), [(0, False), (4, False), (2, True)])
def test_lost_sessions_resync_without_changing_output(loop, pipelined, draft_server,
                                                      target_server, k, pipeline):
    """Evicting both sessions (and the amateur's kept logits) mid-generation costs a
    re-prefill, never a different token."""
    loop = pipelined if pipeline else loop
    p = params(LI)
    evict = evict_at((2, 5), draft_server, target_server)
    result = loop.generate(PROMPTS[0], N, GREEDY, k, on_tokens=evict, contrastive=p)
    assert result.token_ids == reference(PROMPTS[0], p)
    assert result.stats.resyncs >= 2


@pytest.mark.parametrize("k", [0, 4])
def test_a_failed_draft_is_replaced_at_once_without_changing_output(target_client, k):
    """Two draft replicas; the one serving the generation is stopped after round 2: the
    round is repeated on the other (a fresh session, re-prefilled), and the tokens are
    the reference's. Speculative decoding would fall back to target-only; contrastive
    decoding cannot, so it moves."""
    import grpc

    from coordinator.remote.clients import DraftClient
    from coordinator.remote.routing import Router
    from draft_service.__main__ import create as create_draft
    from draft_service.config import DraftConfig

    servers = [create_draft(DraftConfig(model="tiny-random-draft", port=0)) for _ in "ab"]
    for server, _, _ in servers:
        server.start()
    clients = {f"127.0.0.1:{port}": DraftClient(grpc.insecure_channel(f"127.0.0.1:{port}"),
                                                deadline_s=5)
               for _, port, _ in servers}
    loop = SpeculativeLoop(Router.from_clients(clients), target_client,
                           LoopPolicy(pipeline=False))
    p = params(OBRIEN)
    rounds, stopped = 0, []

    def stop_the_busy_one(_tokens, _kinds):
        nonlocal rounds
        rounds += 1
        if rounds == 2:
            busy = next(s for s, _, e in servers if len(e.model.store))
            busy.stop(0)
            stopped.append(busy)

    try:
        result = loop.generate(PROMPTS[0], N, GREEDY, k, on_tokens=stop_the_busy_one,
                               contrastive=p)
        assert stopped and result.token_ids == reference(PROMPTS[0], p)
        assert result.stats.draft_fallbacks >= 1  # the failure was met, and survived
    finally:
        for server, _, _ in servers:
            server.stop(0)


def test_k_left_to_the_server_adapts_and_stays_exact(loop):
    """With K left to the server, contrastive rounds choose K per round (the plain form,
    K = 0, among the choices): Li et al.'s form rejects nearly every tiny draft, so it
    settles on K = 0 and probes now and then; the tokens are the reference's."""
    p = params(LI)
    stats = LoopStats()
    ids = [t for out in loop.rounds(PROMPTS[0], 64, GREEDY, 4, (), stats, load_aware=True,
                                    contrastive=p) for t in out.tokens]
    assert ids == reference(PROMPTS[0], p, 64)
    assert stats.k_per_round[0] == 4 and 0 in stats.k_per_round
    assert stats.k_per_round.count(0) > len(stats.k_per_round) // 2
