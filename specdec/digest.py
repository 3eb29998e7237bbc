"""Rolling 64-bit digest of a token prefix (DESIGN.md, "The cache-sync rule").

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
