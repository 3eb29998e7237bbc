"""Sampled speculative output over the real services follows the target's distribution."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from scipy.stats import chisquare

from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.sampling import SamplingParams, process_logits

PROMPT = [31, 415, 92, 65]
TRIALS = 1500
THREADS = 8  # seeded generations in flight at once: they share the target's passes (8: a
# third less time than 4 on the tiny models, 16 no less)


def target_joint(backend, params: SamplingParams, n: int = 2,
                 prompt: list[int] | None = None,
                 transform=None) -> dict[tuple[int, ...], float]:
    """Exact P(t1..tn) = p(t1 | prompt) * p(t2 | prompt, t1) * ... from the target model;
    `transform(logits [1, V], context)` first changes the logits (penalties, a grammar's
    mask) as the target does."""
    prompt = PROMPT if prompt is None else prompt
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        longer = {}
        for prefix, prob in joint.items():
            context = prompt + list(prefix)
            logits = backend.forward(backend.new_cache(), context)
            if transform is not None:
                logits = transform(logits, context)
            p = process_logits(logits[0], params)
            for t in p.nonzero().flatten().tolist():
                longer[prefix + (t,)] = prob * float(p[t])
        joint = longer
    return joint


def chi_square_p_value(counts: Counter, expected_probs: dict, n: int) -> float:
    """Goodness of fit; cells expected below 5 are pooled into one."""
    assert set(counts) <= set(expected_probs), "emitted a pair the target gives probability 0"
    observed, expected = [], []
    pooled_obs = pooled_exp = 0.0
    for cell, prob in expected_probs.items():
        if prob * n >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(prob * n)
        else:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += prob * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


def run_seeds(generate, trials: int, threads: int = THREADS) -> list:
    """generate(seed) for seeds 0 .. trials-1, `threads` of them in flight at once through
    the same loop (so the target batches them, as under load); results in seed order.
    Each generation's output depends only on its seed, so the counts are those of a
    sequential run, and the test also covers sampling under concurrency."""
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(generate, range(trials), timeout=600))


def sample_outputs(loop, prompt, params: SamplingParams, trials: int, k: int, n: int = 2):
    """The first n tokens of `trials` generations seeded 0, 1, ... (Counter), and the
    drafts accepted and drafted over all of them."""
    from dataclasses import replace

    results = run_seeds(lambda seed: loop.generate(prompt, n, replace(params, seed=seed),
                                                   num_draft_tokens=k), trials)
    counts = Counter(tuple(r.token_ids) for r in results)
    return (counts, sum(r.stats.accepted_tokens for r in results),
            sum(r.stats.drafted_tokens for r in results))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("params", "top_n", "k"),
    [  # top_p0.6-top_n2-K3 truncates both sides; top_k6-K2 is `make test-long`'s
        pytest.param(SamplingParams(temperature=1.0, top_k=6), 0, 2, marks=pytest.mark.long),
        (SamplingParams(temperature=0.8, top_p=0.6), 2, 3),  # sparse q: 2 ids per draft
    ],
    ids=["top_k6-K2", "top_p0.6-top_n2-K3"],
)
def test_two_token_joint_matches_target(draft_client, target_client, target_server,
                                        params, top_n, k):
    backend = target_server[1].model.backend
    expected = target_joint(backend, params)
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False, top_n=top_n))
    counts, accepted, drafted = sample_outputs(loop, PROMPT, params, TRIALS, k)
    assert 0 < accepted < drafted  # both accept and reject paths were exercised
    p_value = chi_square_p_value(counts, expected, TRIALS)
    print(f"chi-square p = {p_value:.3f}, acceptance = {accepted / drafted:.2f}")
    assert p_value > 1e-3, (p_value, counts.most_common(8))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "k"),
    [  # pipelined-exit-K2 exercises both; the others alone are `make test-long`'s
        pytest.param(dict(pipeline=True), 1, marks=pytest.mark.long),
        (dict(pipeline=True, confidence_exit=True, exit_threshold=0.3), 2),
        pytest.param(dict(pipeline=False, confidence_exit=True, exit_threshold=0.3), 3,
                     marks=pytest.mark.long),
    ],
    ids=["pipelined-K1", "pipelined-exit-K2", "exit-K3"],
)
def test_three_token_joint_matches_target_when_pipelined_or_exiting(
        draft_client, target_client, target_server, mode, k):
    """Pre-drafts and early exits change which rounds produce tokens 2 and 3; their joint
    law must still be the target's. Generations run on past 3 tokens so that round 1
    starts a pre-draft (one that could not be used is never started)."""
    params = SamplingParams(temperature=1.0, top_k=4)
    expected = target_joint(target_server[1].model.backend, params, n=3)
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(**mode))
    results = run_seeds(lambda seed: loop.generate(
        PROMPT, 6, SamplingParams(params.temperature, params.top_k, params.top_p, seed),
        num_draft_tokens=k), TRIALS)
    counts = Counter(tuple(r.token_ids[:3]) for r in results)
    pipelined = sum(r.stats.pipelined_rounds for r in results)
    exits = sum(r.stats.confidence_exits for r in results)
    accepted = sum(r.stats.accepted_tokens for r in results)
    drafted = sum(r.stats.drafted_tokens for r in results)
    assert 0 < accepted < drafted
    assert (pipelined > 0) == bool(mode.get("pipeline"))  # the modes were exercised
    assert (exits > 0) == mode.get("confidence_exit", False)
    p_value = chi_square_p_value(counts, expected, TRIALS)
    print(f"chi-square p = {p_value:.3f}, acceptance = {accepted / drafted:.2f}, "
          f"pipelined rounds = {pipelined}, exits = {exits}")
    assert p_value > 1e-3, (p_value, counts.most_common(8))


def test_chi_square_helper_has_power():
    """The helper rejects a clearly different distribution (guards against a vacuous test)."""
    expected = {(0, 0): 0.5, (0, 1): 0.3, (1, 0): 0.2}
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(torch.tensor([0.3, 0.3, 0.4]), 1500, True, generator=g).tolist()
    cells = list(expected)
    counts = Counter(cells[d] for d in draws)
    assert chi_square_p_value(counts, expected, 1500) < 1e-6
