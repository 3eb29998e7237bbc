"""coordinator.api.text.TextStream: stop strings cut the streamed text, whatever the chunking."""

from __future__ import annotations

import random

import pytest

from coordinator.api.text import TextStream


def run_stream(pieces, stop) -> tuple[list[str], str, TextStream]:
    s = TextStream(stop)
    outs = [s.push(p) for p in pieces]
    return outs, s.finish(), s


def test_no_stop_strings_release_everything_at_once():
    s = TextStream()
    assert s.push("Hello") == "Hello"
    assert s.push(", world") == ", world"
    assert s.push("") == ""
    assert not s.stopped
    assert s.finish() == ""


def test_stop_inside_one_delta():
    s = TextStream(["STOP"])
    assert s.push("abc") == "abc"  # no suffix of "abc" can start "STOP"
    assert s.push("def STOP ghi") == "def "
    assert s.stopped
    assert s.push("more") == ""
    assert s.push("STOP") == ""
    assert s.finish() == ""
    assert s.text == "abcdef "


@pytest.mark.parametrize("pieces", [
    ["Hello ST", "OP world"],
    ["Hello S", "T", "OP world"],
    ["Hello ", "S", "TO", "P"],
    ["Hello STO", "P"],
])
def test_stop_split_across_deltas(pieces):
    outs, tail, s = run_stream(pieces, ["STOP"])
    assert s.stopped
    assert "".join(outs) + tail == "Hello "
    released = ""
    for o in outs:
        released += o
        assert "S" not in released


def test_held_back_text_is_released_by_finish():
    outs, tail, s = run_stream(["Hello", " wor", "ld ST"], ["STOP"])
    assert not s.stopped
    assert tail == "ST"  # only what could still begin "STOP" is held back
    assert "".join(outs) + tail == "Hello world ST"


def test_only_a_possible_stop_prefix_is_held_back():
    s = TextStream(["ab", "xyzw"])
    assert s.push("0123456789") == "0123456789"  # no tail can start a stop
    assert s.push("--xy") == "--"  # "xy" may become "xyzw"
    assert s.push("z") == ""
    assert s.finish() == "xyz"


def test_earliest_stop_wins():
    outs, tail, s = run_stream(["one two three four"], ["four", "two", "three"])
    assert s.stopped
    assert "".join(outs) + tail == "one "


def test_earliest_stop_wins_across_deltas():
    # "END" completes first in time (second delta), but "XEN" starts earlier in the text.
    outs, tail, s = run_stream(["aaXE", "ND bb"], ["END", "XEN"])
    assert "".join(outs) + tail == "aa"


def test_stop_at_the_very_start():
    outs, tail, s = run_stream(["STOP and more"], ["STOP"])
    assert s.stopped
    assert outs == [""] and tail == ""


def test_stop_split_at_the_very_start():
    outs, tail, s = run_stream(["S", "TOP and more"], ["STOP"])
    assert s.stopped
    assert "".join(outs) + tail == ""


def test_empty_stop_strings_are_ignored():
    s = TextStream(["", ""])
    assert s.push("abc") == "abc"
    assert not s.stopped
    s = TextStream(["", "X"])
    assert s.push("abc") == "abc"
    assert s.push("dXe") == "d"
    assert s.stopped


def test_overlapping_stop_prefix_is_found():
    # "aab" inside "aaab": the first 'a' is not part of the stop.
    outs, tail, s = run_stream(["a", "a", "a", "b", "c"], ["aab"])
    assert s.stopped
    assert "".join(outs) + tail == "a"


def random_case(seed: int, n_stops: tuple[int, int]):
    """A random text, random stop strings (mostly cut from the text), random split points."""
    rng = random.Random(seed)
    alphabet = "abcST 你🙂"
    full = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    stops = []
    for _ in range(rng.randint(*n_stops)):
        if full and rng.random() < 0.7:
            i = rng.randrange(len(full))
            stops.append(full[i:i + rng.randint(1, 6)])
        else:
            stops.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))))
    cuts = sorted(rng.sample(range(len(full) + 1), min(len(full) + 1, rng.randint(0, 8))))
    pieces = [full[a:b] for a, b in zip([0] + cuts, cuts + [len(full)], strict=True)]
    assert "".join(pieces) == full
    return full, stops, pieces


def stream_checked(full, stops, pieces, expected) -> TextStream:
    """Push `pieces` through a TextStream: released text is always a prefix of
    `expected` and, once finished, all of it. Returns the stream."""
    s = TextStream(stops)
    released = ""
    for p in pieces:
        released += s.push(p)
        assert expected.startswith(released), (full, stops, pieces)
    released += s.finish()
    assert released == expected, (full, stops, pieces)
    return s


@pytest.mark.parametrize("seed", range(300))
def test_property_released_text_ends_before_the_stop(seed):
    full, stops, pieces = random_case(seed, (1, 1))
    stop = stops[0]
    expected = full[:full.find(stop)] if stop and stop in full else full

    s = stream_checked(full, stops, pieces, expected)
    assert s.stopped == (bool(stop) and stop in full)


@pytest.mark.parametrize("seed", range(300))
def test_property_several_stops_cut_at_the_earliest(seed):
    """Several stops, random chunking: exactly the text before the earliest stop."""
    full, stops, pieces = random_case(seed, (2, 4))
    live = [s for s in stops if s]
    hits = [full.find(s) for s in live if s in full]
    expected = full[:min(hits)] if hits else full

    s = stream_checked(full, stops, pieces, expected)
    assert s.stopped == bool(hits)


@pytest.mark.parametrize("pieces", [
    ["abcd"],
    ["ab", "cd"],
    ["ab", "c", "d"],
    ["a", "bc", "d"],
])
def test_earliest_stop_independent_of_chunking(pieces):
    """The text is the same whatever the round sizes were (K changes them)."""
    outs, tail, s = run_stream(pieces, ["abcd", "c"])
    assert s.stopped
    assert "".join(outs) + tail == ""
