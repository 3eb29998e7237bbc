"""Measured step costs for the cost model.

A draft step costs what its backend spends on one token; that depends on how many
decoder layers are kept, not which. The full-depth step is measured on the draft's own
backend (OpenVINO int8 for today's default draft) and scaled per kept-layer count by the
same ratio in torch fp32, t(n) / t(all): one measurement per count, cheap in-process.
Target passes (one token, and K+1 tokens for a verify) are measured on the target's
backend.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch

from specdec.runtime.layer_skip import skipped
from specdec.runtime.models import LoadedModel
from specdec.runtime.torch_backend import TorchBackend

CONTEXT = 96  # cached tokens before the timed passes, about a chat prompt


@contextmanager
def threads(n: int):
    """torch on `n` threads inside the block (the services run one thread each)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pass_ms(backend, vocab: int, n_tokens: int, reps: int = 7, context: int = CONTEXT) -> float:
    """Ms of one pass of a specdec.runtime backend over `n_tokens` new tokens after
    `context` cached ones: the 25th percentile of `reps` passes (other work on a busy
    machine only ever adds time, so a low quantile is steadier than the median)."""
    cache = backend.new_cache()
    backend.forward(cache, [i % vocab for i in range(1, context + 1)])
    times = []
    for rep in range(reps + 1):  # the first pass warms up
        tokens = [(7 * rep + j) % vocab for j in range(n_tokens)]
        t0 = time.perf_counter()
        backend.forward(cache, tokens)
        times.append((time.perf_counter() - t0) * 1000)
        backend.crop(cache, context)
    return statistics.quantiles(times[1:], n=4)[0]


def depth_ms(loaded: LoadedModel, kept: int, reps: int = 7) -> float:
    """Ms of a one-token torch step of `loaded` with only `kept` decoder layers."""
    total = loaded.model.config.num_hidden_layers
    with skipped(loaded.model, tuple(range(kept, total))):
        return pass_ms(TorchBackend(loaded), loaded.vocab_size, 1, reps)
