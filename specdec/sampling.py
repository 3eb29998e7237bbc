"""Sampling parameters and logits processing, shared by draft, target and coordinator.

There is exactly one copy of this code: the draft's q and the target's p must come out
of the same processing or speculative sampling stops being lossless.

Order of processing (as in HF transformers): the logits processors of
`specdec.penalties` (logit bias, repetition, presence and frequency penalties) on the
raw logits, then temperature, top-k, top-p and min-p, then (draft only) sparse
truncation to the most likely tokens holding `top_mass` of the mass, at most `top_n` of
them, and quantisation of what is kept to integer counts (`quantise`), which the draft
samples from (`sample_counts`) and sends. Greedy (temperature 0) is the one-hot
distribution at the argmax of the penalised logits (temperature, top-k, top-p and min-p
never move the argmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from hashlib import blake2b

import torch

from specdec.errors import require
from specdec.grammar import KINDS, Grammar

# A draft's sparse q keeps the fewest most likely tokens holding DEFAULT_TOP_MASS of the
# mass, at most DEFAULT_TOP_N of them. Truncating to mass m costs at most 1 - m of a
# token's acceptance; the cap binds on flat distributions (SmolLM2 at temperature 1) and
# keeps a sampled K = 4 round under 1.2 KB (docs/design.md, section 5).
DEFAULT_TOP_N = 32
DEFAULT_TOP_MASS = 0.99
# Quantize-Sample-Verify: a draft's sparse q is integer counts, each >= 1, summing to
# Q_TOTAL, so q(x) = count(x) / Q_TOTAL exactly. 65535 is the largest total whose every
# count fits in 16 bits, so a q holds at most Q_TOTAL tokens.
Q_TOTAL = 65535


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 0.0  # 0 or 1 = off
    seed: int = 0
    # The logits processors (specdec.penalties; their ranges: `validate`).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids ascending
    prompt_len: int = 0  # the session's first prompt_len tokens are the prompt (the
    # coordinator's Generation sets it)
    grammar: Grammar | None = None  # structured outputs (specdec.grammar)
    # vLLM's min_tokens: stop_token_ids get -inf while fewer tokens than this were
    # generated (specdec.penalties)
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        """Whether any logits processor of specdec.penalties is on."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0
                    or (self.min_tokens > 0 and self.stop_token_ids))

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
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            require(math.isfinite(v) and -2.0 <= v <= 2.0,
                    f"sampling.{name} must be in [-2, 2] (0 = off), got {v}")
        r = self.repetition_penalty
        require(math.isfinite(r) and 0.0 < r <= 2.0,
                f"sampling.repetition_penalty must be in (0, 2] (1 = off), got {r}")
        m = self.min_p
        require(math.isfinite(m) and 0.0 <= m <= 1.0,
                f"sampling.min_p must be in [0, 1] (0 = off), got {m}")
        for token, bias in self.logit_bias:
            require(token >= 0, f"sampling.logit_bias: token ids must be >= 0, got {token}")
            require(math.isfinite(bias) and -100.0 <= bias <= 100.0,
                    f"sampling.logit_bias[{token}] must be in [-100, 100], got {bias}")
        require(self.min_tokens >= 0,
                f"sampling.min_tokens must be >= 0 (0 = off), got {self.min_tokens}")
        require(all(t >= 0 for t in self.stop_token_ids),
                "sampling.stop_token_ids must be token ids (>= 0)")
        require(self.prompt_len >= 0,
                f"sampling.prompt_len must be >= 0, got {self.prompt_len}")
        if self.grammar is not None:
            require(self.grammar.kind in KINDS,
                    "sampling.grammar.kind must be set (json_schema, json_object, regex, "
                    "choice or lark)")
        return self


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [..., V] -> float32 probabilities [..., V] after temperature, top-k, top-p
    and min-p (the logits processors of specdec.penalties come first, by the caller,
    who knows the tokens before each row)."""
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
    if params.min_p > 0.0:  # keeps the most likely token at least
        probs = probs.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def truncate(probs: torch.Tensor, top_n: int,
             top_mass: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the fewest most likely tokens of a 1-D distribution that hold at least
    `top_mass` of its mass, at most `top_n` (and Q_TOTAL) of them, and renormalise.

    Returns (token ids int64, probs float32), most likely first, zero-probability
    tokens dropped. The draft quantises this (`quantise`) and samples from the counts.
    """
    require(top_n >= 1, f"top_n must be >= 1, got {top_n}")
    require(0.0 < top_mass <= 1.0, f"top_mass must be in (0, 1], got {top_mass}")
    n = min(top_n, Q_TOTAL, int((probs > 0).sum()))
    values, ids = torch.topk(probs, n)
    if top_mass < 1.0:
        held = torch.cumsum(values.double(), 0) / float(probs.double().sum())
        n = min(n, int(torch.searchsorted(held, top_mass)) + 1)  # first to reach it
        values, ids = values[:n], ids[:n]
    return ids, (values / values.sum()).float()


def quantise(probs: torch.Tensor) -> torch.Tensor:
    """Quantize-Sample-Verify (2025): a sparse distribution of n <= Q_TOTAL positive
    probabilities (need not be normalised) as int64 counts, each >= 1, summing to
    exactly Q_TOTAL, in the same order.

    Largest remainder: floor(p * Q_TOTAL) raised to at least 1, then one more for the
    largest remainders until the sum is Q_TOTAL, or the excess taken off the largest
    counts. The draft samples from these counts (`sample_counts`) and sends them, so
    the q the target verifies against is exactly the one the token was drawn from.
    """
    n = len(probs)
    require(1 <= n <= Q_TOTAL, f"a quantised q holds 1 to {Q_TOTAL} tokens, got {n}")
    p = probs.double()
    scaled = p / p.sum() * Q_TOTAL
    counts = scaled.floor().long().clamp_(min=1)
    short = Q_TOTAL - int(counts.sum())  # <= n: each floor loses less than 1
    if short > 0:
        order = torch.argsort(scaled - counts, descending=True, stable=True)
        counts[order[:short]] += 1
    while short < 0:  # raising tiny probabilities to 1 overshot: the largest give back
        j = int(counts.argmax())
        take = min(-short, int(counts[j]) - 1)
        counts[j] -= take
        short += take
    return counts


def sample_counts(counts: torch.Tensor, generator: torch.Generator) -> int:
    """One exact draw (an index) from positive integer counts, e.g. `quantise`'s.

    A uniform integer r in [0, total) by rejection from draws of just enough bits
    (each exactly uniform: 2^bits divides the generator's 2^32 range), then the first
    index whose running count exceeds r. Deterministic for a seeded generator.
    """
    cdf = torch.cumsum(counts.long(), 0)
    total = int(cdf[-1])
    span = 1 << (total - 1).bit_length()
    r = total
    while r >= total:
        r = int(torch.randint(0, span, (), generator=generator))
    return int(torch.searchsorted(cdf, torch.tensor([r]), right=True))


def densify(ids: torch.Tensor, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A sparse distribution as a dense float32 vector of length vocab_size."""
    dense = torch.zeros(vocab_size, dtype=torch.float32)
    return dense.index_put_((ids.long(),), probs.float())


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a 1-D distribution (need not be normalised), by inverting its CDF
    at one uniform from `generator`.

    Exact for zero-probability tokens (they never come out: their CDF step is empty) and
    much cheaper than torch.multinomial over a 49k vocabulary (measured: docs/benchmarks.md,
    "Figures behind the code's choices"), which matters when a target service samples K+1
    rows per request for every session in a batch.
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
