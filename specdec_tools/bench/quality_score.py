"""`specdec eval`'s figures: per mode, the text-quality measures of specdec_tools.quality, the
target's log-likelihood of the produced text and tokens/s; per pair of modes, the tok/s
ratio (harness.SPEEDUP_DEFINITION) and whether greedy ids agree.

The log-likelihood ("verification score", as in O'Brien & Lewis 2023's evaluation): the
mean over generated tokens of log p_target(token | prompt + earlier tokens), at
temperature 1 on the target's raw logits, from one forward pass over prompt + text.

Greedy modes repeat over the seeds for timing only: their quality figures count each
prompt's text once (from the first seed), so repeats do not lower distinct-n.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specdec_tools import quality
from specdec_tools.bench import harness
from specdec_tools.bench.quality_eval import COMPARISONS, EvalSample, Mode

LogLik = Callable[[str, list[int]], float | None]  # (prompt, generated ids) -> mean


def mean_loglik(model, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> float | None:
    """Mean of log p(token_ids[i] | prompt_ids + token_ids[:i]) under a transformers
    causal LM `model` (raw logits, temperature 1); None for no tokens."""
    import torch

    if not token_ids:
        return None
    if not prompt_ids:
        raise ValueError("the log-likelihood needs at least one prompt token")
    ids = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    n = len(prompt_ids)
    logp = torch.log_softmax(logits[n - 1:-1], dim=-1)  # row j predicts ids[n + j]
    picked = logp.gather(-1, torch.tensor(list(token_ids))[:, None])
    return float(picked.mean())


def cached(loglik: LogLik) -> LogLik:
    """`loglik` computed once per (prompt, ids): greedy forms share their texts."""
    memo: dict[tuple, float | None] = {}

    def scored(prompt: str, ids: list[int]) -> float | None:
        key = (prompt, tuple(ids))
        if key not in memo:
            memo[key] = loglik(prompt, ids)
        return memo[key]

    return scored


@dataclass
class ModeRow:
    mode: str  # Mode.key
    name: str  # Mode.name
    decoding: str
    k: int
    temperature: float
    generations: int
    texts_scored: int
    tokens_per_s: float | None  # median over generations
    tokens_per_s_min: float | None
    tokens_per_s_max: float | None
    mean_tokens: float | None  # generated tokens per generation
    distinct_1: float | None  # pooled over the scored texts
    distinct_2: float | None
    entropy_1: float | None  # bits, pooled
    entropy_2: float | None
    entropy_3: float | None
    seq_rep_4: float | None  # mean over the scored texts
    loglik: float | None  # mean over the scored texts of each text's mean
    mean_head_size: float | None = None  # contrastive modes: mean over generations
    acceptance: float | None = None  # K > 0: accepted / drafted
    deterministic: bool | None = None  # greedy: every seed gave the same ids
    # Both hops (the clients' byte meter), prefill included, over generated tokens.
    bytes_per_token: float | None = None


@dataclass
class Comparison:
    scenario: str  # Mode.key
    baseline: str
    ratio: float | None  # harness.speedup: median per-(prompt, seed) tok/s ratio
    pairs: int
    greedy: bool
    identical: bool | None = None  # greedy pairs: ids equal on every (prompt, seed)
    # identical ids are required: two forms of one greedy decoding (the contrastive
    # forms); across decodings (contrastive vs the target's greedy) they are a finding
    required: bool = False
    mismatches: list[str] = field(default_factory=list)  # "prompt (seed index)"


def _mean(xs: Sequence[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def scored_samples(group: list[EvalSample], mode: Mode) -> list[EvalSample]:
    return [s for s in group if s.repeat == 0] if mode.greedy else group


def mode_row(mode: Mode, group: list[EvalSample], loglik: LogLik | None) -> ModeRow:
    tps = [s.tokens_per_s for s in group]
    scored = scored_samples(group, mode)
    texts = [s.text for s in scored]
    row = ModeRow(
        mode.key, mode.name, mode.decoding, mode.k, mode.temperature, len(group), len(scored),
        statistics.median(tps) if tps else None, min(tps, default=None),
        max(tps, default=None), _mean([s.tokens for s in group]),
        quality.corpus_distinct_n(texts, 1), quality.corpus_distinct_n(texts, 2),
        quality.corpus_ngram_entropy(texts, 1), quality.corpus_ngram_entropy(texts, 2),
        quality.corpus_ngram_entropy(texts, 3), _mean([quality.seq_rep(t, 4) for t in texts]),
        _mean([loglik(s.prompt, s.token_ids) for s in scored]) if loglik else None)
    tokens = sum(s.tokens for s in group)
    row.bytes_per_token = sum(s.wire_bytes for s in group) / tokens if tokens else None
    if mode.contrastive:
        row.mean_head_size = _mean([s.mean_head_size for s in group])
    if mode.k:
        drafted = sum(s.drafted for s in group)
        row.acceptance = sum(s.accepted for s in group) / drafted if drafted else None
    if mode.greedy:
        first = {s.prompt: s.token_ids for s in scored}
        row.deterministic = all(s.token_ids == first.get(s.prompt) for s in group)
    return row


def compare(samples: list[EvalSample], by_key: dict[str, Mode], scenario: str,
            baseline: str) -> Comparison:
    sc, base = by_key[scenario], by_key[baseline]
    ratios = harness.ratios(samples, sc.name, base.name)
    greedy = sc.greedy and base.greedy
    out = Comparison(scenario, baseline, harness.speedup(samples, sc.name, base.name),
                     len(ratios), greedy, required=greedy and sc.decoding == base.decoding)
    if out.greedy:
        ids = {(s.prompt, s.repeat): s.token_ids for s in samples if s.mode == baseline}
        for s in samples:
            if s.mode == scenario and ids.get((s.prompt, s.repeat)) != s.token_ids:
                out.mismatches.append(f"{s.prompt!r} (seed index {s.repeat})")
        out.identical = not out.mismatches if ratios else None
    return out


def summarise(samples: list[EvalSample], chosen: Sequence[Mode],
              loglik: LogLik | None = None) -> tuple[list[ModeRow], list[Comparison]]:
    """One row per mode that produced samples, and the COMPARISONS whose two modes ran.
    Pass `cached(loglik)` where texts repeat (greedy forms share theirs)."""
    by_key = {m.key: m for m in chosen}
    rows = []
    for mode in chosen:
        group = [s for s in samples if s.mode == mode.key]
        if group:
            rows.append(mode_row(mode, group, loglik))
    ran = {r.mode for r in rows}
    comparisons = [compare(samples, by_key, a, b) for a, b in COMPARISONS
                   if a in ran and b in ran]
    return rows, comparisons
