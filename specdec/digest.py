"""Rolling 64-bit digest of a token prefix (docs/design.md, "The prefix digest").

d_0 = 0; d_i = blake2b(d_{i-1} as 8 little-endian bytes + t_i as 4 little-endian bytes,
digest_size=8), read little-endian. Servers keep d_0..d_n per session so checking a
prefix costs O(1); any client can compute the same numbers with hashlib.
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b

EMPTY = 0


def extend(digest: int, token: int) -> int:
    """The digest of a prefix after appending one token."""
    data = digest.to_bytes(8, "little") + (token & 0xFFFFFFFF).to_bytes(4, "little")
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


def digest(tokens: Iterable[int], start: int = EMPTY) -> int:
    """The digest of `tokens`, continuing from the digest `start` of what precedes them."""
    d = start
    for t in tokens:
        d = extend(d, t)
    return d


def prefix_digests(tokens: Iterable[int], start: int = EMPTY) -> list[int]:
    """[d_1, ..., d_n]: the digest after each token, continuing from `start`."""
    out = []
    d = start
    for t in tokens:
        d = extend(d, t)
        out.append(d)
    return out


class TokenPrefix:
    """Token ids with the digest of every prefix: `prefix[i]` is the digest of `tokens[:i]`.

    The one tracker of prefix digests: the coordinator's committed ids and a server's
    cached session both keep one, so checking a (keep_len, keep_digest) promise is O(1).
    """

    def __init__(self, tokens: Iterable[int] = ()):
        self.tokens: list[int] = []
        self.prefix: list[int] = [EMPTY]  # always len(tokens) + 1 entries
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        tokens = list(tokens)
        self.tokens.extend(tokens)
        self.prefix.extend(prefix_digests(tokens, self.prefix[-1]))

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens."""
        del self.tokens[length:]
        del self.prefix[length + 1:]

    def digest_of(self, length: int) -> int:
        """The digest of tokens[:length]."""
        return self.prefix[length]

    def extended(self, tokens: Iterable[int]) -> TokenPrefix:
        """A copy with `tokens` appended (this one is unchanged)."""
        other = TokenPrefix()
        other.tokens, other.prefix = list(self.tokens), list(self.prefix)
        other.extend(tokens)
        return other
