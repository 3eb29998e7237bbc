"""specdec.digest against the formula in docs/design.md ("The prefix digest"), recomputed here."""

from __future__ import annotations

import random
from hashlib import blake2b

import pytest

from specdec import digest


def ref_extend(d: int, t: int) -> int:
    data = d.to_bytes(8, "little") + t.to_bytes(4, "little")
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


def ref_prefixes(tokens: list[int], start: int = 0) -> list[int]:
    """[d_0, d_1, ..., d_n] straight from the docs/design.md definition."""
    out = [start]
    for t in tokens:
        out.append(ref_extend(out[-1], t))
    return out


def random_tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    # Include the extremes of the 4-byte range.
    return [rng.choice([0, 1, 2**32 - 1, rng.randrange(2**32), rng.randrange(200_000)])
            for _ in range(n)]


def test_empty_prefix_is_zero():
    assert digest.EMPTY == 0
    assert digest.digest([]) == 0
    assert digest.prefix_digests([]) == []
    assert digest.digest([], start=12345) == 12345
    assert digest.prefix_digests([], start=12345) == []


@pytest.mark.parametrize("d, t", [(0, 0), (0, 1), (1, 0), (2**64 - 1, 2**32 - 1),
                                  (0xDEADBEEFCAFEBABE, 151_643), (7, 128_000)])
def test_extend_matches_formula(d, t):
    assert digest.extend(d, t) == ref_extend(d, t)
    assert 0 <= digest.extend(d, t) < 2**64


@pytest.mark.parametrize("seed, n", [(0, 1), (1, 2), (2, 17), (3, 300)])
def test_digest_and_prefix_digests_match_formula(seed, n):
    tokens = random_tokens(seed, n)
    ref = ref_prefixes(tokens)
    assert digest.prefix_digests(tokens) == ref[1:]
    assert digest.digest(tokens) == ref[-1]
    # Accepts any iterable, not only lists.
    assert digest.digest(iter(tokens)) == ref[-1]
    assert digest.prefix_digests(tuple(tokens)) == ref[1:]
    for i in range(n + 1):
        assert digest.digest(tokens[:i]) == ref[i]


@pytest.mark.parametrize("split", [0, 1, 5, 19, 20])
def test_continuing_from_a_start_digest(split):
    tokens = random_tokens(42, 20)
    ref = ref_prefixes(tokens)
    head, tail = tokens[:split], tokens[split:]
    start = digest.digest(head)
    assert start == ref[split]
    assert digest.digest(tail, start=start) == ref[-1]
    assert digest.prefix_digests(tail, start=start) == ref[split + 1 :]
    # A start that is not the head's digest gives the formula continued from it.
    other = 0x0123456789ABCDEF
    assert digest.digest(tail, start=other) == ref_prefixes(tail, other)[-1]


def test_order_and_content_sensitivity():
    assert digest.digest([1, 2]) != digest.digest([2, 1])
    assert digest.digest([1, 2, 3]) != digest.digest([1, 3, 2])
    assert digest.digest([0]) != digest.EMPTY
    assert digest.digest([0]) != digest.digest([0, 0])
    assert digest.digest([5]) != digest.digest([6])
    # Token ids are 4 bytes: (1, 256) and (256, 1) must not collide either.
    assert digest.digest([1, 256]) != digest.digest([256, 1])


def test_no_collisions_among_short_prefixes():
    tokens = random_tokens(7, 500)
    ds = [0] + digest.prefix_digests(tokens)
    assert len(set(ds)) == len(ds)
