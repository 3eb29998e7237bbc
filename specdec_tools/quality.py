"""Text-quality measures of generated text, over whitespace tokens (issue 14's
`specdec eval`): diversity and repetition, the axes on which contrastive decoding is
claimed to beat greedy decoding and sampling.

- distinct-n (Li et al. 2016, "A Diversity-Promoting Objective Function for Neural
  Conversation Models"): distinct n-grams over all n-grams.
- n-gram entropy (Zhang et al. 2018, "Generating Informative and Diverse Conversational
  Responses via Adversarial Information Maximization"): the Shannon entropy, in bits, of
  the n-gram frequency distribution.
- seq-rep-4 (Welleck et al. 2019, "Neural Text Generation with Unlikelihood Training"):
  1 - distinct-4 of one text, the share of its 4-grams that repeat an earlier one.

Each takes one text; `corpus` pools the n-grams of several texts (distinct-n and entropy
over a prompt set are then not averages of per-text figures). Texts shorter than n words
have no n-grams: their figures are None, never a made-up 0 or 1.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence


def words(text: str) -> list[str]:
    return text.split()


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def _counts(texts: Iterable[str], n: int) -> Counter:
    c: Counter = Counter()
    for text in texts:
        c.update(ngrams(words(text), n))
    return c


def distinct_n(text: str, n: int) -> float | None:
    return corpus_distinct_n([text], n)


def corpus_distinct_n(texts: Iterable[str], n: int) -> float | None:
    c = _counts(texts, n)
    total = sum(c.values())
    return len(c) / total if total else None


def ngram_entropy(text: str, n: int) -> float | None:
    return corpus_ngram_entropy([text], n)


def corpus_ngram_entropy(texts: Iterable[str], n: int) -> float | None:
    c = _counts(texts, n)
    total = sum(c.values())
    if not total:
        return None
    return -sum(k / total * math.log2(k / total) for k in c.values())


def seq_rep(text: str, n: int = 4) -> float | None:
    d = distinct_n(text, n)
    return None if d is None else 1.0 - d
