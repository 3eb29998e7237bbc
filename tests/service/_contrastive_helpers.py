"""Shared by the contrastive tests: parameters as the wire carries them, and the
in-process reference decode of the tiny pair (cached)."""

from __future__ import annotations

import functools

import numpy as np

from specdec.contrastive import OBRIEN, ContrastiveParams
from specdec.runtime.models import TINY_DRAFT, TINY_TARGET, build_tiny
from specdec_tools import contrastive_reference


def f32(x: float) -> float:
    """What a float field carries on the wire: the reference must use the same value."""
    return float(np.float32(x))


def params(formulation: str = OBRIEN, alpha: float = 0.1, beta: float = 0.5,
           amateur_temperature: float = 1.0) -> ContrastiveParams:
    return ContrastiveParams(f32(alpha), f32(beta), f32(amateur_temperature), formulation)


@functools.cache
def tiny_pair():
    """The tiny expert and amateur as Hugging Face models (built from their fixed seeds)."""
    return build_tiny(TINY_TARGET).model, build_tiny(TINY_DRAFT).model


@functools.cache
def _reference(prompt: tuple[int, ...], p: ContrastiveParams, n: int) -> tuple[int, ...]:
    return tuple(contrastive_reference.decode(*tiny_pair(), list(prompt), n, p))


def reference(prompt, p: ContrastiveParams, n: int = 24) -> list[int]:
    """Greedy contrastive decoding of the tiny pair, computed in this process."""
    return list(_reference(tuple(prompt), p, n))
