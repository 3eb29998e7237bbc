"""What the coordinator believes each service's cache holds, and the sync formula.

keep_len = longest common prefix of (believed cache, committed), at most
len(committed) - 1; new_tokens = committed[keep_len:]. That one formula covers
rejection rollback, the all-accepted case, the "last committed token is the next input"
convention and recovery after a restart (an empty belief gives keep_len = 0).
"""

from __future__ import annotations

from specdec import digest as digests


class Committed:
    """The committed token ids of a generation, with the digest of every prefix."""

    def __init__(self, tokens: list[int]):
        self.tokens: list[int] = []
        self.prefix = [digests.EMPTY]  # prefix[i] = digest of tokens[:i]
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        self.prefix.extend(digests.prefix_digests(tokens, self.prefix[-1]))

    def __len__(self) -> int:
        return len(self.tokens)

    def extended(self, tokens: list[int]) -> Committed:
        """A copy with `tokens` appended (the original is unchanged)."""
        other = Committed([])
        other.tokens, other.prefix = list(self.tokens), list(self.prefix)
        other.extend(tokens)
        return other


class CacheView:
    """The token ids a service's session cache holds, as far as the coordinator knows."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def plan(self, committed: Committed) -> tuple[int, int, list[int]]:
        """(keep_len, keep_digest, new_tokens) for the next request."""
        limit = min(len(self.tokens), len(committed) - 1)
        keep = 0
        while keep < limit and self.tokens[keep] == committed.tokens[keep]:
            keep += 1
        return keep, committed.prefix[keep], committed.tokens[keep:]

    def holds(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    def forget(self) -> None:
        """After a resync error: assume nothing, so the next request re-prefills."""
        self.tokens = []
