"""specdec.sampling.process_logits: greedy, temperature, top-k, top-p (vs a float64 reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.sampling import (
    SamplingParams,
    process_logits,
)


def reference_probs(logits: np.ndarray, temperature: float, top_k: int = 0,
                    top_p: float = 0.0) -> np.ndarray:
    """Temperature, then top-k, then top-p, in float64, one row at a time."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if 0 < top_k < len(p):
        keep = np.argsort(-p, kind="stable")[:top_k]
        mask = np.zeros_like(p, dtype=bool)
        mask[keep] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    if 0.0 < top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        n = int(np.searchsorted(cum, top_p)) + 1  # smallest prefix with mass >= top_p
        mask = np.zeros_like(p, dtype=bool)
        mask[order[:n]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


def test_greedy_is_one_hot_at_argmax():
    logits = torch.tensor([0.3, -1.0, 2.5, 2.4, 0.0])
    probs = process_logits(logits, SamplingParams())
    assert probs.dtype == torch.float32
    assert probs.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]


def test_greedy_ties_pick_the_first_index():
    logits = torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0])
    assert process_logits(logits, SamplingParams()).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_greedy_ignores_top_k_and_top_p():
    logits = torch.tensor([0.1, 0.2, 5.0, 0.3])
    probs = process_logits(logits, SamplingParams(temperature=0.0, top_k=2, top_p=0.5))
    assert probs.tolist() == [0.0, 0.0, 1.0, 0.0]


def test_greedy_batch_rowwise():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 11, generator=g)
    probs = process_logits(logits, SamplingParams())
    assert probs.shape == (6, 11)
    for row, lrow in zip(probs, logits, strict=True):
        assert row.sum().item() == 1.0
        assert row[int(np.argmax(lrow.numpy()))].item() == 1.0


def test_greedy_accepts_half_precision_logits():
    logits = torch.tensor([0.5, 1.5, -2.0], dtype=torch.float16)
    probs = process_logits(logits, SamplingParams())
    assert probs.dtype == torch.float32
    assert probs.tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("temperature", [0.05, 0.5, 1.0, 1.7, 10.0])
def test_temperature_is_softmax_of_scaled_logits(temperature):
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(16, generator=g) * 3
    probs = process_logits(logits, SamplingParams(temperature=temperature))
    expected = reference_probs(logits.numpy(), temperature)
    np.testing.assert_allclose(probs.numpy(), expected, rtol=1e-5, atol=1e-7)
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("temperature", [1e-3, 1e-6, 1e-20, 1e-30])
def test_tiny_temperature_is_still_a_distribution(temperature):
    logits = torch.tensor([1.0, 2.0, -3.0, 1.5])
    probs = process_logits(logits, SamplingParams(temperature=temperature).validate())
    assert torch.isfinite(probs).all()
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("top_k", [0, 2])
def test_subnormal_temperature_is_the_argmax_not_nan(top_k):
    """1e-40 fits a float32 on the wire; logits / t must not overflow into NaN."""
    params = SamplingParams(temperature=1e-40, top_k=top_k).validate()
    probs = process_logits(torch.tensor([1.0, 2.0, -3.0]), params)
    assert probs.tolist() == [0.0, 1.0, 0.0]


def test_temperature_changes_sharpness():
    logits = torch.tensor([2.0, 1.0, 0.0])
    cold = process_logits(logits, SamplingParams(temperature=0.5))
    hot = process_logits(logits, SamplingParams(temperature=2.0))
    assert cold[0] > hot[0]
    assert cold[2] < hot[2]


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_top_k_keeps_exactly_k_renormalised(k):
    logits = torch.tensor([0.1, 2.0, -1.0, 1.5, 0.7, 3.0, -0.2, 0.0])
    probs = process_logits(logits, SamplingParams(temperature=1.0, top_k=k))
    kept = set(torch.nonzero(probs).flatten().tolist())
    top = set(np.argsort(-logits.numpy())[:k].tolist())
    assert kept == top
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)
    expected = reference_probs(logits.numpy(), 1.0, top_k=k)
    np.testing.assert_allclose(probs.numpy(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("k", [8, 9, 1000])
def test_top_k_at_least_vocab_is_noop(k):
    logits = torch.tensor([0.1, 2.0, -1.0, 1.5, 0.7, 3.0, -0.2, 0.0])
    plain = process_logits(logits, SamplingParams(temperature=0.8))
    assert torch.equal(process_logits(logits, SamplingParams(temperature=0.8, top_k=k)), plain)
    assert torch.equal(process_logits(logits, SamplingParams(temperature=0.8, top_k=0)), plain)


@pytest.mark.parametrize(
    "top_p, n_kept",
    [(0.3, 1), (0.5, 1), (0.51, 2), (0.79, 2), (0.8, 2), (0.81, 3), (0.95, 3), (0.96, 4),
     (0.999, 4)],
)
def test_top_p_keeps_smallest_set_reaching_mass(top_p, n_kept):
    base = torch.tensor([0.15, 0.5, 0.05, 0.3])  # sorted: .5, .3, .15, .05
    probs = process_logits(base.log(), SamplingParams(temperature=1.0, top_p=top_p))
    order = [1, 3, 0, 2]
    kept = torch.nonzero(probs).flatten().tolist()
    assert sorted(kept) == sorted(order[:n_kept])
    expected = torch.zeros(4)
    expected[order[:n_kept]] = base[order[:n_kept]] / base[order[:n_kept]].sum()
    torch.testing.assert_close(probs, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("top_p", [0.0, 1.0])
def test_top_p_zero_or_one_is_off(top_p):
    logits = torch.tensor([0.3, -1.0, 2.5, 2.4, 0.0])
    plain = process_logits(logits, SamplingParams(temperature=1.3))
    assert torch.equal(process_logits(logits, SamplingParams(temperature=1.3, top_p=top_p)),
                       plain)


@pytest.mark.parametrize("top_p", [1e-9, 0.01])
def test_top_p_always_keeps_the_top_token(top_p):
    logits = torch.tensor([0.3, -1.0, 2.5, 2.4, 0.0])
    probs = process_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))
    assert probs.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]


def test_top_k_is_applied_before_top_p():
    # probs .4 .3 .2 .1. top-k 2 first -> .571 .429, then top-p .5 keeps one token.
    # (top-p first would keep {.4, .3} and top-k would leave both.)
    base = torch.tensor([0.4, 0.3, 0.2, 0.1])
    probs = process_logits(base.log(), SamplingParams(temperature=1.0, top_k=2, top_p=0.5))
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_temperature_is_applied_before_top_p():
    base = np.array([0.5, 0.3, 0.15, 0.05])
    logits = torch.tensor(np.log(base), dtype=torch.float32)
    # At T = 1, top_p = .8 keeps 2 tokens; at T = 3 the distribution is flatter.
    hot = process_logits(logits, SamplingParams(temperature=3.0, top_p=0.8))
    expected = reference_probs(np.log(base), 3.0, top_p=0.8)
    assert int((hot > 0).sum()) == int((expected > 0).sum()) > 2
    np.testing.assert_allclose(hot.numpy(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", range(6))
def test_random_logits_match_reference(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 50, generator=g) * 2
    temperature = [0.3, 0.7, 1.0, 1.5, 2.0, 0.9][seed]
    top_k = [0, 5, 20, 49, 3, 0][seed]
    top_p = [0.9, 0.0, 0.5, 0.99, 0.7, 0.2][seed]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = process_logits(logits, params)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    for row, lrow in zip(probs, logits, strict=True):
        expected = reference_probs(lrow.numpy(), temperature, top_k, top_p)
        assert set(np.nonzero(row.numpy())[0]) == set(np.nonzero(expected)[0])
        np.testing.assert_allclose(row.numpy(), expected, rtol=1e-4, atol=1e-7)


def test_batch_is_processed_row_by_row():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(5, 30, generator=g) * 2
    logits[2] = logits[2] * 10  # very different rows must not affect each other
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.8)
    batch = process_logits(logits, params)
    for i in range(5):
        torch.testing.assert_close(batch[i], process_logits(logits[i], params))
    # And with a leading extra dimension.
    batch3 = process_logits(logits.view(1, 5, 30), params)
    torch.testing.assert_close(batch3[0], batch)
