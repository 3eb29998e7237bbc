"""specdec_tools.quality on texts whose figures can be counted by hand."""

from __future__ import annotations

import math

import pytest

from specdec_tools.quality import (
    corpus_distinct_n,
    corpus_ngram_entropy,
    distinct_n,
    ngram_entropy,
    seq_rep,
)


def test_by_hand():
    text = "a b a b a b"  # bigrams: ab ba ab ba ab
    assert distinct_n(text, 1) == 2 / 6
    assert distinct_n(text, 2) == 2 / 5
    assert ngram_entropy(text, 1) == pytest.approx(1.0)  # a, b equally often: 1 bit
    p = [3 / 5, 2 / 5]
    assert ngram_entropy(text, 2) == pytest.approx(-sum(x * math.log2(x) for x in p))
    assert seq_rep("w x y z w x y z", 4) == pytest.approx(1 - 4 / 5)


def test_no_repetition_and_too_short():
    text = "one two three four five"
    assert distinct_n(text, 2) == 1.0 and seq_rep(text) == 0.0
    assert ngram_entropy(text, 3) == pytest.approx(math.log2(3))
    assert distinct_n("one two", 3) is None and ngram_entropy("", 1) is None
    assert seq_rep("too short") is None


def test_corpus_pools_ngrams():
    texts = ["a b", "a b"]
    assert corpus_distinct_n(texts, 1) == 2 / 4  # not the mean of per-text 1.0
    assert corpus_ngram_entropy(texts, 2) == 0.0
