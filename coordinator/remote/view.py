"""What the coordinator believes each service's cache holds, and the sync formula.

keep_len = longest common prefix of (believed cache, committed), at most
len(committed) - 1; new_tokens = committed[keep_len:]. That one formula covers
rejection rollback, the all-accepted case, the "last committed token is the next input"
convention and recovery after a restart (an empty belief gives keep_len = 0)
(docs/design.md, "The cache-sync rule"). The committed ids themselves are a
specdec.digest.TokenPrefix, which keeps the digest of every prefix.
"""

from __future__ import annotations

from specdec.digest import TokenPrefix


class CacheView:
    """The token ids a service's session cache holds, as far as the coordinator knows."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def plan(self, committed: TokenPrefix, min_new: int = 1) -> tuple[int, int, list[int]]:
        """(keep_len, keep_digest, new_tokens) for the next request, which feeds at least
        `min_new` tokens (0: a look-up in what the server holds may feed none)."""
        limit = min(len(self.tokens), len(committed) - min_new)
        if self.tokens[:limit] == committed.tokens[:limit]:
            keep = max(limit, 0)  # the usual case, compared at C speed
        else:
            keep = 0
            while keep < limit and self.tokens[keep] == committed.tokens[keep]:
                keep += 1
        return keep, committed.digest_of(keep), committed.tokens[keep:]

    def holds(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    def served(self, sent: list[int], cached_len: int) -> None:
        """After a success: the server holds the first `cached_len` of the ids `sent`
        (what it kept plus what it was fed), as its reply says."""
        self.tokens = list(sent[:cached_len])

    def truncate(self, length: int) -> None:
        """The server says it holds only `length` tokens: believe no more than that."""
        del self.tokens[length:]

    def forget(self) -> None:
        """Assume nothing, so the next request re-prefills."""
        self.tokens = []
