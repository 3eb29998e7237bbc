"""What pipelined drafting with a draft model could give one request at a time, replayed
offline from the target's greedy text, the draft's ranking at each of its positions and
measured pass costs (`specdec replay-predraft`).

Greedy rounds are decided by tokens alone, so a round can be replayed without the
services once the target's text is known: the draft's drafts along the text are its
top-ranked tokens there (teacher-forced: the text is what the drafts must match), the
drafts the text confirms are accepted, and the round commits them plus the target's
token. What pipelining adds is a second question per round: was the next round's
pre-draft, computed on the draft's device while the target verified this round, made
on the outcome that happened? Then the next round's drafts are at hand; else they are
fetched first (the target waits for `fetch` draft passes) and verified then.

The schemes (`Scheme`):

  branches 0   the coordinator's today (coordinator.loop.predraft): one pre-draft, on
               every draft accepted and the bonus equal to the draft's own next token;
  branches B   also a pre-draft for each rejection point j < K, on the target's token
               there being among the draft's ranks 2..B+1, and B more bonus guesses:
               1 + B + K x B branches, each K + 1 tokens, drafted side by side in
               passes of that many sessions (a tree of pre-drafts: PEARL's idea of
               drafting while verifying, Liu et al. 2024, over the outcomes the draft
               ranks likeliest, as SpecBranch, 2025, branches at a rejection);
  fetch F      after a miss, fetch F drafts (at most K), not K: a shorter wait, a
               narrower round, while the next pre-draft is still sized K.

Each round is charged max(verify of its width, the pre-draft's passes) plus, after a
miss, the fetch's passes. Target-only decoding is one width-1 verify per token, so

    replayed speedup = tokens x verify(1) / sum over rounds of the round's charge

which leaves out the RPCs and the coordinator's own time (~15% on the Qwen2.5-Coder
pair, docs/design.md section 28): it says what a scheme can reach, and how the schemes
rank, not what the server will measure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PassCosts:
    verify_ms: dict[int, float]  # a target pass of this width (1 + drafts), one session
    draft_ms: dict[int, float]  # a one-token draft pass over this many sessions

    def verify(self, width: int) -> float:
        return _interpolate(self.verify_ms, width)

    def draft(self, sessions: int) -> float:
        return _interpolate(self.draft_ms, sessions)


def _interpolate(table: dict[int, float], x: int) -> float:
    """Linear between measured points; beyond the last, along the last two (or
    proportionally, from one point)."""
    if x in table:
        return table[x]
    xs = sorted(table)
    below = [p for p in xs if p < x]
    above = [p for p in xs if p > x]
    if below and above:
        lo, hi = below[-1], above[0]
    elif len(xs) >= 2:
        lo, hi = (xs[-2], xs[-1]) if below else (xs[0], xs[1])
    else:
        return table[xs[0]] * max(1, x) / max(1, xs[0])
    return table[lo] + (table[hi] - table[lo]) * (x - lo) / (hi - lo)


@dataclass(frozen=True)
class Scheme:
    k: int
    branches: int = 0
    fetch: int | None = None  # drafts fetched after a miss (None: k)

    @property
    def label(self) -> str:
        parts = [f"K={self.k}"]
        if self.branches:
            parts.append(f"{self.branches} branch{'es' if self.branches > 1 else ''}")
        if self.fetch is not None and self.fetch < self.k:
            parts.append(f"fetch {self.fetch}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Replay:
    tokens: int
    rounds: int
    fetched: int  # rounds whose drafts were fetched after a miss
    ms: float
    speedup: float


def replay(text: Sequence[int], ranks: Sequence[Sequence[int]], costs: PassCosts,
           scheme: Scheme) -> Replay:
    """Replay `scheme` over `text` (the target's greedy tokens), `ranks[i]` the draft's
    tokens at position i best first (module notes)."""
    if not text or len(ranks) != len(text):
        raise ValueError("need the target's text and the draft's ranks at each of its "
                         f"positions (got {len(text)} tokens, {len(ranks)} rankings)")
    b = scheme.branches
    n, p, ms, rounds, fetched, ready = len(text), 0, 0.0, 0, 0, False
    while p < n:
        k = min(scheme.k, n - p - 1)
        rounds += 1
        if k <= 0:  # the last token: nothing to draft for
            ms += costs.verify(1)
            p += 1
            continue
        pre_k = k  # the next round's pre-draft is sized K whatever this round holds
        if not ready:
            f = k if scheme.fetch is None else min(scheme.fetch, k)
            fetched += 1
            if f == 0:  # a round without drafts; its pre-draft guesses its bonus
                ms += max(costs.verify(1), (pre_k + 1) * costs.draft(1 + b))
                ready = text[p] in ranks[p][:1 + b]
                p += 1
                continue
            k = f
            ms += k * costs.draft(1)  # the fetch's passes, before the Verify
        accepted = 0
        while accepted < k and ranks[p + accepted][0] == text[p + accepted]:
            accepted += 1
        sessions = 1 + b + k * b
        ms += max(costs.verify(k + 1), (pre_k + 1) * costs.draft(sessions))
        q = p + accepted
        if accepted == k:  # every draft held: the bonus is at q (if any is left)
            ready = q + 1 < n and text[q] in ranks[q][:1 + b]
        else:  # rejected at q: the target's token is not the draft's first
            ready = text[q] in ranks[q][1:1 + b]
        p = q + 1
    return Replay(n, rounds, fetched, ms, n * costs.verify(1) / ms)


@dataclass(frozen=True)
class Agreement:
    top1: float  # the draft's first choice is the target's token
    rank2_of_misses: float  # ... else its second is
    ranks23_of_misses: float  # ... else its second or third is


def agreement(texts: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> Agreement:
    pairs = [(t, r) for text, ranks in texts for t, r in zip(text, ranks, strict=True)]
    misses = [(t, r) for t, r in pairs if r[0] != t]
    top1 = 1 - len(misses) / max(1, len(pairs))
    rank2 = sum(1 for t, r in misses if t in r[1:2]) / max(1, len(misses))
    rank23 = sum(1 for t, r in misses if t in r[1:3]) / max(1, len(misses))
    return Agreement(top1, rank2, rank23)


def median_speedup(texts, costs: PassCosts, scheme: Scheme) -> float:
    """The median over texts of the replayed speedup (the benches' definition)."""
    return statistics.median(replay(text, ranks, costs, scheme).speedup
                             for text, ranks in texts)


def draft_ranks(backend, prompt: Sequence[int], text: Sequence[int],
                depth: int = 4) -> list[list[int]]:
    """The draft's `depth` best tokens at each position of `text` after `prompt`, fed
    in one pass (teacher-forced)."""
    cache = backend.new_cache()
    context = list(prompt) + list(text[:-1])
    logits = backend.forward(cache, context, len(text))
    return logits.topk(depth, dim=-1).indices.tolist()
