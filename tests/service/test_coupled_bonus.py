"""Coupled bonus guesses in sampled pipelined speculative rounds (coordinator.loop
Generation.bonus_seed; VerifyRequest.bonus_seed, ProposeRequest.guess_last).

The target draws the bonus by Gumbel-max with the round's noise, the draft its guess at
it with the same noise: the bonus is still an exact draw from p_{K+1} (the chi-square
tests of test_sampled_distribution.py run pipelined with it on), and the guess agrees
more often than an independent draw, so more pre-drafts are used."""

from __future__ import annotations

from collections import Counter

import grpc
import pytest
import torch

from coordinator.loop import LoopStats, SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec import coupling
from specdec.sampling import SamplingParams, process_logits
from specdec.v1 import common_pb2
from tests.service.conftest import GREEDY, verify_req
from tests.service.test_sampled_distribution import chi_square_p_value

PROMPTS = [[5, 6, 7, 8], [700, 12, 99], [42, 43, 44, 45, 46]]


def guess_hits(loop, seeds) -> tuple[int, int]:
    """(rounds that accepted every draft, and of those the ones whose bonus was the
    draft's guess), over sampled pipelined generations."""
    all_accepted = agreed = 0
    for seed in seeds:
        stats = LoopStats()
        params = SamplingParams(temperature=1.0, top_k=8, seed=seed)
        for _ in loop.rounds(PROMPTS[seed % 3], 24, params, 3, stats=stats):
            pass
        all_accepted += stats.guess_rounds - stats.guess_rejections
        agreed += stats.guess_rounds - stats.guess_rejections - stats.guess_bonus_misses
    return all_accepted, agreed


@pytest.mark.long  # a rate, not exactness (the exact draw is the next test)
def test_coupling_makes_the_guess_agree_with_the_bonus_more_often(draft_client,
                                                                  target_client):
    def loop(couple):
        return SpeculativeLoop(draft_client, target_client,
                               LoopPolicy(pipeline=True, drafter="model", couple_bonus=couple))

    n_c, agree_c = guess_hits(loop(True), range(40))
    n_i, agree_i = guess_hits(loop(False), range(40))
    assert n_c > 30 and n_i > 30
    print(f"guess = bonus: coupled {agree_c}/{n_c}, independent {agree_i}/{n_i}")
    assert agree_c / n_c > agree_i / n_i + 0.1


def test_the_coupled_bonus_is_an_exact_draw_and_the_seed_decides_it(target_server,
                                                                     target_stub):
    """Over many seeds, Verify's bonus with bonus_seed follows p (chi-square), and it is
    coupling.draw's: a function of the seed and p alone."""
    backend = target_server[1].model.backend
    prompt = [31, 415, 92, 65]
    params = SamplingParams(temperature=1.0, top_k=6)
    p = process_logits(backend.forward(backend.new_cache(), prompt)[0], params)
    sampling = common_pb2.SamplingParams(temperature=1.0, top_k=6, seed=7)

    def bonus(seed: int) -> int:
        req = verify_req(f"cb-{seed}", prompt, sampling=sampling, round_seed=1)
        req.bonus_seed = seed
        try:
            return target_stub.Verify(req).bonus_token
        finally:
            target_stub.Release(common_pb2.ReleaseRequest(session_id=f"cb-{seed}"))

    trials = 1200
    counts = Counter(bonus(seed) for seed in range(trials))
    expected = {t: float(p[t]) for t in p.nonzero().flatten().tolist()}
    p_value = chi_square_p_value(counts, expected, trials)
    print(f"chi-square p = {p_value:.3f}")
    assert p_value > 1e-3
    for seed in (5, 77):
        assert bonus(seed) == coupling.draw(torch.arange(p.shape[0]), p, seed)


def test_a_bonus_seed_on_a_greedy_round_is_refused(target_stub):
    req = verify_req("cb-greedy", [1, 2, 3], sampling=GREEDY)
    req.bonus_seed = 3
    with pytest.raises(grpc.RpcError) as err:
        target_stub.Verify(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bonus_seed" in err.value.details()
