"""specdec.sampling: parameter validation, truncation to the top n, seeding, sampling."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.errors import InvalidArgument
from specdec.sampling import (
    SamplingParams,
    densify,
    derive_seed,
    generator,
    process_logits,
    sample,
    truncate,
)

# -- SamplingParams.validate ----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": -1e-30}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": -math.inf}, "temperature"),
        ({"top_p": -0.01}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"top_p": math.inf}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_validate_rejects(kwargs, field):
    with pytest.raises(InvalidArgument) as info:
        SamplingParams(**kwargs).validate()
    assert field in info.value.message
    assert info.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": 0.0},
        {"temperature": 1e-4},
        {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "seed": 2**64 - 1},
        {"temperature": 5.0, "top_p": 0.0},
        {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
        {"temperature": 1.0, "top_k": 1},
    ],
)
def test_validate_accepts(kwargs):
    params = SamplingParams(**kwargs)
    assert params.validate() is params


def test_greedy_flag():
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.0, top_k=5).greedy
    assert not SamplingParams(temperature=0.5).greedy


# -- truncate / densify ---------------------------------------------------------------


def test_truncate_top_n_most_likely_first():
    probs = torch.tensor([0.1, 0.4, 0.0, 0.2, 0.3])
    ids, q = truncate(probs, 2)
    assert ids.dtype == torch.int64 and q.dtype == torch.float32
    assert ids.tolist() == [1, 4]
    torch.testing.assert_close(q, torch.tensor([0.4 / 0.7, 0.3 / 0.7]))
    assert q.sum().item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("top_n", [4, 5, 100])
def test_truncate_drops_zero_probability_tokens(top_n):
    probs = torch.tensor([0.1, 0.4, 0.0, 0.2, 0.3])
    ids, q = truncate(probs, top_n)
    assert ids.tolist() == [1, 4, 3, 0]
    assert (q > 0).all()
    torch.testing.assert_close(q, torch.tensor([0.4, 0.3, 0.2, 0.1]))


def test_truncate_one_hot_and_n_one():
    ids, q = truncate(torch.tensor([0.0, 0.0, 1.0, 0.0]), 64)
    assert ids.tolist() == [2] and q.tolist() == [1.0]
    ids, q = truncate(torch.tensor([0.2, 0.5, 0.3]), 1)
    assert ids.tolist() == [1] and q.tolist() == [1.0]


def test_truncate_renormalises_unnormalised_input():
    ids, q = truncate(torch.tensor([2.0, 6.0, 2.0]), 2)
    assert ids.tolist()[0] == 1
    assert q.tolist()[0] == pytest.approx(0.75)
    assert q.sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("top_n", [0, -1])
def test_truncate_rejects_bad_top_n(top_n):
    with pytest.raises(InvalidArgument, match="top_n"):
        truncate(torch.tensor([0.5, 0.5]), top_n)


def test_densify_places_probs_at_ids():
    dense = densify(torch.tensor([4, 1]), torch.tensor([0.75, 0.25]), 6)
    assert dense.dtype == torch.float32
    assert dense.tolist() == [0.0, 0.25, 0.0, 0.0, 0.75, 0.0]
    assert densify(torch.tensor([], dtype=torch.int64), torch.tensor([]), 3).tolist() == [0.0] * 3


def test_densify_truncate_round_trip():
    g = torch.Generator().manual_seed(9)
    probs = process_logits(torch.randn(40, generator=g), SamplingParams(temperature=1.0, top_k=25))
    ids, q = truncate(probs, 1000)
    assert len(ids) == 25
    torch.testing.assert_close(densify(ids, q, 40), probs, rtol=1e-5, atol=1e-7)
    # Truncated: the dense form is the renormalised top-n restricted distribution.
    ids, q = truncate(probs, 5)
    dense = densify(ids, q, 40)
    top5 = torch.topk(probs, 5).indices
    expected = torch.zeros(40)
    expected[top5] = probs[top5] / probs[top5].sum()
    torch.testing.assert_close(dense, expected, rtol=1e-5, atol=1e-7)


# -- seeds and sampling ---------------------------------------------------------------


def test_derive_seed_deterministic_and_salt_sensitive():
    a = derive_seed(123, "round", 1)
    assert a == derive_seed(123, "round", 1)
    assert 0 <= a < 2**63
    others = [
        derive_seed(123, "round", 2),
        derive_seed(124, "round", 1),
        derive_seed(123, "draft", 1),
        derive_seed(123, 1, "round"),
        derive_seed(123, "round1"),
        derive_seed(123, "round"),
        derive_seed(123),
    ]
    assert a not in others
    assert len(set(others)) == len(others)
    assert derive_seed(2**64 - 1, "x") < 2**63


def test_generator_streams_are_reproducible():
    a = torch.rand(8, generator=generator(7, "uniforms"))
    b = torch.rand(8, generator=generator(7, "uniforms"))
    c = torch.rand(8, generator=generator(7, "other"))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sample_is_reproducible_with_same_seed():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    g1 = torch.Generator().manual_seed(2024)
    g2 = torch.Generator().manual_seed(2024)
    s1 = [sample(probs, g1) for _ in range(50)]
    s2 = [sample(probs, g2) for _ in range(50)]
    assert s1 == s2
    assert len(set(s1)) > 1
    g3 = torch.Generator().manual_seed(2025)
    assert [sample(probs, g3) for _ in range(50)] != s1


def test_sample_never_draws_zero_probability_and_accepts_unnormalised():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.0])
    draws = [sample(probs, g) for _ in range(400)]
    assert set(draws) == {1, 3}
    assert all(isinstance(x, int) for x in draws)
    # Roughly 3:1 (binomial, n = 400: sd ~ 8.7; allow > 5 sd).
    assert abs(draws.count(1) - 300) < 45
