"""Sampling parameters and logits processing, shared by draft, target and coordinator.

There is exactly one copy of this code: the draft's q and the target's p must come out
of the same processing or speculative sampling stops being lossless.

Order of processing (as in HF transformers and vLLM): temperature, then top-k, then
top-p, then (draft only) sparse truncation to the `top_n` most likely tokens.
Greedy (temperature 0) is the one-hot distribution at the argmax of the raw logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from hashlib import blake2b

import torch

from specdec.errors import require

DEFAULT_TOP_N = 64


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 0.0  # 0 or 1 = off
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> SamplingParams:
        """Raise InvalidArgument naming the first bad field; return self."""
        t = self.temperature
        require(math.isfinite(t) and t >= 0.0,
                f"sampling.temperature must be finite and >= 0 (0 = greedy), got {t}")
        require(self.top_k >= 0, f"sampling.top_k must be >= 0 (0 = off), got {self.top_k}")
        p = self.top_p
        require(math.isfinite(p) and 0.0 <= p <= 1.0,
                f"sampling.top_p must be in [0, 1] (0 or 1 = off), got {p}")
        require(0 <= self.seed < 2**64, f"sampling.seed must fit in 64 bits, got {self.seed}")
        return self


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [..., V] -> float32 probabilities [..., V] after temperature/top-k/top-p."""
    logits = logits.float()
    if params.greedy:
        one_hot = torch.zeros_like(logits)
        return one_hot.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    # Shift by the max first: a tiny temperature then sends the others to -inf instead
    # of overflowing every logit to +-inf (inf - inf = NaN in the softmax).
    logits = (logits - logits.amax(-1, keepdim=True)) / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if 0.0 < params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p  # never drops the most likely token
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def truncate(probs: torch.Tensor, top_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the `top_n` most likely tokens of a 1-D distribution and renormalise.

    Returns (token ids int64, probs float32), most likely first, zero-probability
    tokens dropped. The draft samples from exactly this distribution and sends it.
    """
    require(top_n >= 1, f"top_n must be >= 1, got {top_n}")
    n = min(top_n, int((probs > 0).sum()))
    values, ids = torch.topk(probs, n)
    return ids, (values / values.sum()).float()


def densify(ids: torch.Tensor, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A sparse distribution as a dense float32 vector of length vocab_size."""
    dense = torch.zeros(vocab_size, dtype=torch.float32)
    return dense.index_put_((ids.long(),), probs.float())


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a 1-D distribution (need not be normalised), by inverting its CDF
    at one uniform from `generator`.

    Exact for zero-probability tokens (they never come out: their CDF step is empty) and
    about ten times cheaper than torch.multinomial over a 49k vocabulary, which matters
    when a target service samples K+1 rows per request for every session in a batch.
    """
    cdf = torch.cumsum(probs.double(), 0)
    u = float(torch.rand((), generator=generator, dtype=torch.float64)) * float(cdf[-1])
    index = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True))
    return min(index, len(cdf) - 1)


def derive_seed(seed: int, *salt: int | str) -> int:
    """A 63-bit seed from a request seed and a salt (round index, position, ...)."""
    h = blake2b(digest_size=8)
    h.update(int(seed).to_bytes(8, "little"))
    for s in salt:
        h.update(b"|" + str(s).encode())
    return int.from_bytes(h.digest(), "little") >> 1


def generator(seed: int, *salt: int | str) -> torch.Generator:
    """A CPU torch.Generator seeded from `derive_seed(seed, *salt)`."""
    return torch.Generator().manual_seed(derive_seed(seed, *salt))
