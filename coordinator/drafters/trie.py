"""Model-free drafting: continuations looked up in text already seen.

SuffixDecoding (Oliaro et al. 2024) drafts from suffix trees over prompts and earlier
outputs; prompt lookup (Saxena 2023; transformers' PromptLookupCandidateGenerator,
OpenVINO GenAI's prompt_lookup) from n-gram matches in the prompt. Both rest on one
observation: extraction, summarisation, code edits and agent loops copy spans of text
they have already seen, and a copy costs nothing to draft.

`SuffixTrie` holds every substring of up to `depth` tokens of the sequences added to it,
with how often each occurred. Appending a token extends the trie by the suffixes ending
there (at most `depth` nodes), so a generation keeps its trie current as it commits. To
draft, the longest suffix of the context (up to `max_match` tokens) that occurred before
*with a continuation* is found, and its most frequent continuation is followed child by
child. Each step's empirical probability (child count over the counts of its siblings)
multiplies into the path's probability; drafting stops when that falls below
`min_prob`, so an ambiguous continuation drafts few tokens.

Nothing here touches the network or a model: the drafts cost a few dict look-ups, and in
sampled mode their q is a point mass (specdec.wire.point_mass_dist), which the verify
math accepts like any other q, so the output keeps the target's distribution.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_DEPTH = 24  # longest substring stored: a match plus its continuation
DEFAULT_MAX_MATCH = 8  # longest context suffix matched
DEFAULT_MIN_PROB = 0.15  # stop drafting once the path's empirical probability is below


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


@dataclass(frozen=True)
class Lookup:
    """A model-free proposal: its tokens, how long a context suffix it continued, and
    the expected number of its tokens the target accepts if the counts are right (the
    sum of the path's cumulative empirical probabilities)."""

    tokens: list[int]
    match_len: int
    expected: float
    first_prob: float = 1.0  # the first draft's empirical probability (1: one continuation)
    source: str = "lookup"  # what it was looked up in (Drafts.source): the text seen, or
    # a prediction (coordinator.drafters.prediction)

    def __bool__(self) -> bool:
        return bool(self.tokens)


NO_LOOKUP = Lookup([], 0, 0.0)


class SuffixTrie:
    """Every substring of at most `depth` tokens of the sequences appended, counted."""

    def __init__(self, depth: int = DEFAULT_DEPTH):
        if depth < 2:
            raise ValueError(f"depth must be >= 2, got {depth}")
        self.depth = depth
        self.root = _Node()
        self.nodes = 1
        # Open suffixes of the sequence being appended: node of tokens[s:] for the last
        # depth - 1 starts s (the empty suffix is the root).
        self._open: list[_Node] = []

    def start(self) -> None:
        """The next `append` begins a new sequence (no substring spans two)."""
        self._open = []

    def append(self, token: int) -> None:
        extended = []
        for node in [self.root] + self._open:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
                self.nodes += 1
            child.count += 1
            extended.append(child)
        self._open = extended[: self.depth - 1]  # the longest (depth) suffix is closed

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(t)

    def add(self, tokens: Sequence[int]) -> None:
        """Add one whole sequence."""
        self.start()
        self.extend(tokens)
        self.start()

    def remove(self, tokens: Sequence[int]) -> None:
        """Take back one sequence given to `add` (its counts, and the nodes left empty)."""
        for s in range(len(tokens)):
            node = self.root
            for t in tokens[s: s + self.depth]:
                child = node.children[t]
                child.count -= 1
                if child.count == 0:
                    del node.children[t]
                    self.nodes -= _size(child)
                    break
                node = child

    def match(self, context: Sequence[int], max_match: int) -> tuple[_Node | None, int]:
        """The node of the longest suffix of `context` (at most `max_match` tokens) that
        has a continuation, and that suffix's length; (None, 0) when none has."""
        for m in range(min(max_match, len(context), self.depth - 1), 0, -1):
            node = self.root
            for t in context[len(context) - m:]:
                node = node.children.get(t)
                if node is None:
                    break
            if node is not None and node.children:
                return node, m
        return None, 0

    def draft(self, context: Sequence[int], max_tokens: int,
              max_match: int = DEFAULT_MAX_MATCH, min_prob: float = DEFAULT_MIN_PROB) -> Lookup:
        node, m = self.match(context, max_match)
        if node is None or max_tokens <= 0:
            return NO_LOOKUP
        tokens: list[int] = []
        prob, expected, first = 1.0, 0.0, 1.0
        while node.children and len(tokens) < min(max_tokens, self.depth - m):
            total = sum(c.count for c in node.children.values())
            token, child = max(node.children.items(), key=lambda kv: kv[1].count)
            p = prob * child.count / total
            if tokens and p < min_prob:
                break
            if not tokens:
                first = p
            tokens.append(token)
            prob, expected, node = p, expected + p, child
        return Lookup(tokens, m, expected, first)


def _size(node: _Node) -> int:
    n, stack = 0, [node]
    while stack:
        x = stack.pop()
        n += 1
        stack.extend(x.children.values())
    return n


class OutputCache:
    """The most recent outputs of each tenant, `per_tenant` of them at most, in a trie of
    the tenant's own: one tenant's text never drafts for another (a draft's speed would
    tell what others wrote). Shared by the generations of a coordinator replica."""

    def __init__(self, per_tenant: int, depth: int = DEFAULT_DEPTH):
        self.per_tenant, self.depth = per_tenant, depth
        self._lock = threading.Lock()
        self._tenants: dict[str, tuple[SuffixTrie, OrderedDict[int, list[int]]]] = {}
        self._next = 0

    def add(self, tenant: str, tokens: Sequence[int]) -> None:
        if self.per_tenant <= 0 or not tokens:
            return
        with self._lock:
            trie, kept = self._tenants.setdefault(tenant, (SuffixTrie(self.depth),
                                                           OrderedDict()))
            trie.add(tokens)
            self._next += 1
            kept[self._next] = list(tokens)
            while len(kept) > self.per_tenant:
                _, old = kept.popitem(last=False)
                trie.remove(old)

    def draft(self, tenant: str, context: Sequence[int], max_tokens: int,
              max_match: int, min_prob: float) -> Lookup:
        with self._lock:
            entry = self._tenants.get(tenant)
            if entry is None:
                return NO_LOOKUP
            return entry[0].draft(context, max_tokens, max_match, min_prob)

    def sequences(self, tenant: str) -> int:
        with self._lock:
            entry = self._tenants.get(tenant)
            return len(entry[1]) if entry else 0


def better(a: Lookup, b: Lookup) -> Lookup:
    """The proposal to use of two: the longer match (more context agrees), then the
    higher expected accepted length."""
    return max(a, b, key=lambda x: (x.match_len, x.expected))
