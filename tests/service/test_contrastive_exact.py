"""Greedy contrastive decoding over the real services equals, token for token, the
reference computed in this process from the two models' logits with the formula
(specdec.contrastive_reference: Hugging Face models, no cache, nothing shared with the
services' runtime), for both formulations, the plain form (K = 0) and the speculative
form (K > 0), alone, concurrently and after lost sessions."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from coordinator.loop import SpeculativeLoop
from coordinator.policy import LoopPolicy
from specdec import contrastive_reference
from specdec.contrastive import LI, OBRIEN, ContrastiveParams
from specdec.runtime.models import TINY_DRAFT, TINY_TARGET, build_tiny
from specdec.sampling import SamplingParams

GREEDY = SamplingParams()
PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99]]
N = 24


def f32(x: float) -> float:
    """What a float field carries on the wire: the reference must use the same value."""
    return float(np.float32(x))


def params(formulation: str = OBRIEN, alpha: float = 0.1, beta: float = 0.5,
           amateur_temperature: float = 1.0) -> ContrastiveParams:
    return ContrastiveParams(f32(alpha), f32(beta), f32(amateur_temperature), formulation)


@pytest.fixture(scope="module")
def models():
    return build_tiny(TINY_TARGET).model, build_tiny(TINY_DRAFT).model


@pytest.fixture(scope="module")
def reference(models):
    cache: dict = {}

    def ref(prompt, p: ContrastiveParams, n: int = N) -> list[int]:
        key = (tuple(prompt), p, n)
        if key not in cache:
            cache[key] = contrastive_reference.decode(*models, prompt, n, p)
        return cache[key]

    return ref


@pytest.fixture()
def loop(draft_client, target_client):
    return SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False))


FORMS = [params(OBRIEN), params(LI), params(LI, amateur_temperature=0.5),
         params(OBRIEN, alpha=0.02, beta=1.5)]
FORM_IDS = ["obrien", "li", "li-Ta0.5", "obrien-a0.02-b1.5"]


@pytest.mark.parametrize("p", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("k", [0, 1, 4])
def test_greedy_equals_the_in_process_reference(loop, reference, p, k):
    for prompt in PROMPTS:
        want = reference(prompt, p)
        result = loop.generate(prompt, N, GREEDY, num_draft_tokens=k, contrastive=p)
        assert result.token_ids == want, (prompt, k)
        stats = result.stats
        assert stats.head_positions >= N and stats.mean_head_size >= 1
        if k:
            assert stats.drafted_tokens > 0 and stats.rounds < N + 1


def test_contrastive_is_not_target_greedy_and_its_limits_are(loop, reference):
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


def test_the_pipelined_policy_still_gives_the_reference(draft_client, target_client,
                                                        reference):
    """A coordinator whose speculative rounds pre-draft and exit early: contrastive rounds
    run without either and give the same tokens."""
    loop = SpeculativeLoop(draft_client, target_client,
                           LoopPolicy(pipeline=True, confidence_exit=True, adaptive_k=True))
    p = params(OBRIEN)
    result = loop.generate(PROMPTS[1], N, GREEDY, num_draft_tokens=4, contrastive=p)
    assert result.token_ids == reference(PROMPTS[1], p)
    assert result.stats.pipelined_rounds == 0 and result.stats.confidence_exits == 0


def test_concurrent_contrastive_and_speculative_generations(loop, reference):
    """Contrastive and speculative generations share the services' batched passes and
    still each give their own exact output."""
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


@pytest.mark.parametrize("k", [0, 4])
def test_lost_sessions_resync_without_changing_output(loop, reference, draft_server,
                                                      target_server, k):
    """Evicting both sessions (and the amateur's kept logits) mid-generation costs a
    re-prefill, never a different token."""
    p = params(LI)
    rounds = 0

    def evict(_tokens, _kinds):
        nonlocal rounds
        rounds += 1
        if rounds in (2, 5):
            for store in (draft_server[1].model.store, target_server[1].model.store):
                for session_id in list(store._idle):
                    store.release(session_id)

    result = loop.generate(PROMPTS[0], N, GREEDY, k, on_tokens=evict, contrastive=p)
    assert result.token_ids == reference(PROMPTS[0], p)
    assert result.stats.resyncs >= 2
