"""The model-free look-up as a drafter: drafts copied from the generation's own text.

A suffix trie over the prompt and the committed ids (coordinator.drafters.trie) proposes the
tokens that followed the longest recent match of the context's end (prompt lookup
decoding; Saxena 2023, and the n-gram proposers of vLLM and llama.cpp). How many of them
to send is chosen by expected tokens per cost with per-bucket acceptance learnt during
the generation (coordinator.drafters.costs's cost model). Each draft's q is a point mass: it was
chosen, not drawn, so a sampled round accepts x_i with probability p_i(x_i) and a
rejection resamples from p_i without x_i (coordinator.lookup_round).

With an output cache (--lookup-cache) it also drafts from the tenant's recent outputs,
and adds this output to them when the generation ends. With a client's prediction
(Predicted Outputs, coordinator.drafters.prediction) it drafts from that first.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.drafters.base import LOOKUP, NO_DRAFTS, Drafts, Outcome
from coordinator.drafters.costs import UNIQUE, Acceptance, LookupSettings, best_length
from coordinator.drafters.prediction import PREDICTION, Prediction
from coordinator.drafters.trie import NO_LOOKUP, Lookup, OutputCache, SuffixTrie, better
from specdec import wire


class LookupDrafter:
    source = LOOKUP

    def __init__(self, prompt: Sequence[int], settings: LookupSettings, greedy: bool = True,
                 cache: OutputCache | None = None, tenant: str | None = None,
                 request_k: int = 0, prediction: Prediction | None = None):
        self.settings, self.greedy = settings, greedy
        self.request_k = request_k  # the generation's K when the load does not lower it
        self.cache = cache if tenant is not None else None
        self.tenant = tenant
        # The trie indexes the context lazily, when a proposal needs it: while the
        # planner keeps K at 0 (under load) the look-up costs the engine's steps nothing.
        self.trie = SuffixTrie(settings.depth)
        self.indexed = 0  # ids of the context already in the trie
        self.seen = len(prompt)  # ids of the context already counted (prompt, output)
        self.output: list[int] = []
        self.acceptance = Acceptance(greedy)
        self.last: Lookup = NO_LOOKUP  # what the latest proposal was built from
        self.prediction = prediction  # the client's predicted output (Predicted Outputs)
        self.max_tokens = max(settings.max_tokens,
                              prediction.max_tokens if prediction is not None else 0)
        # The planner's word on the target (coordinator.loop.plan.Planner.target_loaded):
        # a verified draft costs it more than the look-up's cost model assumes.
        self.target_loaded = False

    def find(self, context: Sequence[int], k: int) -> Lookup:
        """The look-up's best proposal of at most k drafts after `context` (NO_LOOKUP
        when no match, or none worth its cost)."""
        self._catch_up(context)
        self.last = NO_LOOKUP
        s = self.settings
        n = min(k, s.max_tokens)
        if n <= 0:
            return NO_LOOKUP
        if self.prediction is not None:  # the client's prediction first, while it holds
            predicted = self.prediction.find(context, k)
            if predicted:
                self.last = predicted
                return predicted
        self._index(context)
        found = self.trie.draft(context, n, s.max_match, s.min_prob)
        if self.cache is not None:
            found = better(found, self.cache.draft(self.tenant, context, n, s.max_match,
                                                   s.min_prob))
        if not found:
            return NO_LOOKUP
        rate = self.acceptance.rate(found.match_len, found.first_prob >= UNIQUE)
        n, expected = best_length(rate, len(found.tokens), s.verify_cost)
        if n:
            self.last = Lookup(found.tokens[:n], found.match_len, expected, found.first_prob)
        return self.last

    def propose(self, context: Sequence[int], k: int) -> Drafts:
        found = self.find(context, self.cap(k))
        return self.drafts(found) if found else NO_DRAFTS

    def cap(self, k: int) -> int:
        """The look-up's cap when the round's K is k: its own maximum (it may draft more
        than K: its drafts cost the draft service nothing) unless the planner lowered K
        below the generation's while the target is loaded (a verified draft costs it more
        than the look-up's cost model assumes): then k. A K lowered because the draft
        service is the bottleneck says nothing against the look-up."""
        return k if self.target_loaded and k < self.request_k else self.max_tokens

    def drafts(self, found: Lookup) -> Drafts:
        tokens = list(found.tokens)
        dists = [] if self.greedy else [wire.point_mass_dist(t) for t in tokens]
        return Drafts(tokens, dists, [1.0] * len(tokens), found.source)

    def prepare(self, context, drafts, k, seeds=(None, None)):
        return None  # nothing to ask anyone

    def fetch(self, context, k, guess=False, seed=None):
        return None

    has_drafts = False

    def observe(self, outcome: Outcome) -> None:
        if outcome.drafts.source == PREDICTION and outcome.drafts:
            self.prediction.observe(len(outcome.drafts), outcome.accepted)
        if outcome.drafts.source == LOOKUP and outcome.drafts:
            last = self.last
            self.acceptance.observe(last.match_len, len(outcome.drafts), outcome.accepted,
                                    last.first_prob >= UNIQUE)
        self._catch_up(outcome.committed)

    def finished(self) -> None:
        """The output joins the tenant's recent outputs (when the cache is on)."""
        if self.cache is not None and self.output:
            self.cache.add(self.tenant, self.output)

    def _catch_up(self, context: Sequence[int]) -> None:
        """Count the committed ids not seen yet as output."""
        if len(context) > self.seen:
            self.output.extend(context[self.seen:])
            self.seen = len(context)

    def _index(self, context: Sequence[int]) -> None:
        """Add the context's ids the trie has not indexed yet (in order: the same trie
        as indexing them one round at a time)."""
        if len(context) > self.indexed:
            self.trie.extend(context[self.indexed:])
            self.indexed = len(context)
