"""Predicted Outputs: drafts from the text the client expects the answer to resemble.

OpenAI's `prediction` ({"type": "content", "content": ...}: a file being edited, a
document being rewritten) is speculative decoding with a draft the user supplies. The
look-up drafts from it (coordinator.drafters.lookup, through which the hybrid rule also
weighs it against the draft model): while the output follows the prediction, the next
tokens of the prediction are the drafts; when the output leaves it (an edit: an
insertion, a deletion, a changed word), the output's last tokens are looked up in the
prediction again and drafting resumes after the match nearest to where it was.

A draft's q is a point mass, as for any look-up: verification keeps every emitted token
the target's, so a wrong prediction costs rejected drafts, never a different output.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.drafters.adaptive import ema
from coordinator.drafters.trie import NO_LOOKUP, Lookup

PREDICTION = "prediction"  # Drafts.source of drafts taken from a prediction
LONGEST_MATCH = 8  # output tokens matched against the prediction to realign
SHORTEST_MATCH = 2  # a shorter match is too likely by chance
PRIOR = 0.9  # per-token acceptance before any round: the client says the text is likely


class Prediction:
    def __init__(self, tokens: Sequence[int], prompt_len: int, max_tokens: int):
        self.tokens = list(tokens)
        self.prompt_len = prompt_len  # the output starts after the prompt
        self.max_tokens = max_tokens  # drafts per round at most
        self.rate = PRIOR  # per-token acceptance, a moving average over rounds
        self._at = (0, 0)  # (output length, prediction position it was aligned with)
        self._pairs: dict[tuple[int, ...], list[int]] = {}  # every token pair's starts
        for i in range(len(self.tokens) - SHORTEST_MATCH + 1):
            self._pairs.setdefault(tuple(self.tokens[i:i + SHORTEST_MATCH]), []).append(i)

    def find(self, context: Sequence[int], n: int) -> Lookup:
        """At most n drafts after `context` (prompt and output): the prediction's tokens
        after the place the output has reached in it; NO_LOOKUP when it is not aligned."""
        output = context[self.prompt_len:]
        at = self._align(output)
        if at is None or n <= 0:
            return NO_LOOKUP
        tokens = self.tokens[at:at + min(n, self.max_tokens)]
        if not tokens:
            return NO_LOOKUP
        expected = sum(self.rate ** (i + 1) for i in range(len(tokens)))
        return Lookup(tokens, LONGEST_MATCH, expected, 1.0, PREDICTION)

    def observe(self, drafted: int, accepted: int) -> None:
        """A round of this prediction's drafts: `accepted` of `drafted` kept."""
        self.rate = ema(self.rate, accepted / drafted, 0.5)

    def _align(self, output: Sequence[int]) -> int | None:
        """The prediction position the output's next token should match, or None."""
        done, at = self._at
        if done <= len(output):
            tail = list(output[done:])
            if self.tokens[at:at + len(tail)] == tail:  # still following it
                self._at = (len(output), at + len(tail))
                return at + len(tail)
        expected = at + max(0, len(output) - done)
        found = self._realign(output, expected)
        if found is not None:
            self._at = (len(output), found)
        return found

    def _realign(self, output: Sequence[int], expected: int) -> int | None:
        """After the longest match (up to LONGEST_MATCH tokens, at least SHORTEST_MATCH)
        of the output's end in the prediction, the one nearest `expected`."""
        if len(output) < SHORTEST_MATCH:
            return None
        best, best_key = None, None
        for start in self._pairs.get(tuple(output[-SHORTEST_MATCH:]), ()):
            end = start + SHORTEST_MATCH
            m = SHORTEST_MATCH
            while m < min(LONGEST_MATCH, len(output), end) and \
                    self.tokens[end - m - 1] == output[-m - 1]:
                m += 1
            key = (-m, abs(end - expected))
            if best_key is None or key < best_key:
                best, best_key = end, key
        return best
