"""coordinator.api.service: streaming, generate() and the concurrency limit (fake loop)."""

from __future__ import annotations

import math

import pytest

from coordinator.api.service import GenerationService, Limits
from coordinator.loop import RoundOutput
from specdec.errors import InvalidArgument, ResourceExhausted
from specdec.sampling import SamplingParams
from specdec.v1 import common_pb2
from tests.unit import _generation_helpers
from tests.unit._generation_helpers import (
    IM_END,
    LIMITS,
    A,
    B,
    FakeLoop,
    R,
    T,
    encode,
    request,
    rounds_of,
    service,
)

tok = _generation_helpers.tok  # the shared module-scoped fixture


# -- stream / generate ---------------------------------------------------------------


def test_stream_chunks_follow_the_rounds(tok):
    pieces = ["Hello", ", wor", "ld! 你好", " 🚀"]
    script = rounds_of(tok, pieces, reason="length")
    script[1] = RoundOutput(script[1].tokens, [A] * (len(script[1].tokens) - 1) + [R], None)
    script[2] = RoundOutput(script[2].tokens, [T] * len(script[2].tokens), None)
    svc, loop = service(tok, script, stats=dict(drafted_tokens=9, accepted_tokens=6,
                                                 seconds=0.25))
    req = request(prompt="Say hi", max_new_tokens=30, num_draft_tokens=3,
                  sampling=common_pb2.SamplingParams(temperature=0.5, seed=9))
    chunks = list(svc.stream(req))

    assert len(chunks) == len(script)
    for chunk, out in zip(chunks, script, strict=True):
        assert list(chunk.token_ids) == out.tokens
        assert list(chunk.kinds) == [int(k) for k in out.kinds]
    assert [c.finish_reason for c in chunks] == ["", "", "", "length"]
    assert not any(c.HasField("stats") for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == "".join(pieces)
    assert chunks[0].text == "Hello"  # no stop strings: nothing held back

    stats = chunks[-1].stats
    n_generated = sum(len(o.tokens) for o in script)
    assert stats.prompt_tokens == len(encode(tok, "Say hi"))
    assert stats.generated_tokens == n_generated
    assert stats.rounds == len(script)
    assert (stats.drafted_tokens, stats.accepted_tokens) == (9, 6)
    assert stats.seconds == pytest.approx(0.25)

    (call,) = loop.calls
    assert call["prompt_ids"] == encode(tok, "Say hi")
    assert call["max_new_tokens"] == 30 and call["k"] == 3 and call["eos_ids"] == [IM_END]
    assert call["sampling"] == SamplingParams(0.5, 0, 0.0, 9)
    assert loop.yielded == len(script) and loop.ended == 1


def test_split_character_waits_for_its_round(tok):
    ids = encode(tok, "🎉")
    assert len(ids) >= 2
    script = [RoundOutput([ids[0]], [A], None), RoundOutput(ids[1:], [B] * (len(ids) - 1), None),
              RoundOutput(encode(tok, "!"), [T], "length")]
    svc, _ = service(tok, script)
    assert [c.text for c in svc.stream(request())] == ["", "🎉", "!"]


def test_eos_round(tok):
    ids = encode(tok, "Done.")
    script = [RoundOutput(ids, [A] * len(ids), None), RoundOutput([IM_END], [B], "eos")]
    svc, _ = service(tok, script)
    chunks = list(svc.stream(request()))
    assert chunks[-1].finish_reason == "eos"
    assert list(chunks[-1].token_ids) == [IM_END]
    assert "".join(c.text for c in chunks) == "Done."
    assert chunks[-1].stats.generated_tokens == len(ids) + 1


def test_held_back_text_comes_with_the_last_chunk(tok):
    script = rounds_of(tok, ["Hello wor", "ld"], reason="length")
    svc, _ = service(tok, script)
    chunks = list(svc.stream(request(stop=["world!"])))
    assert chunks[0].text == "Hello "  # "wor" could begin the stop string: held back
    assert "".join(c.text for c in chunks) == "Hello world"
    assert chunks[-1].finish_reason == "length"


def test_incomplete_character_at_the_end_is_flushed(tok):
    ids = encode(tok, "ok 🎉")
    script = [RoundOutput(ids[:-1], [A] * (len(ids) - 1), "length")]
    svc, _ = service(tok, script)
    (chunk,) = list(svc.stream(request()))
    assert chunk.text == tok.decode(ids[:-1])
    assert chunk.text.startswith("ok ")


def test_stop_string_ends_the_generation_and_closes_the_loop(tok):
    pieces = ["The quick", " brown f", "ox jumps", " over the", " lazy dog"]
    script = rounds_of(tok, pieces, reason="length")
    svc, loop = service(tok, script)
    chunks = list(svc.stream(request(stop=["fox"])))

    assert len(chunks) == 3  # the round where "fox" completes is the last
    assert chunks[-1].finish_reason == "stop"
    assert "".join(c.text for c in chunks) == "The quick brown "
    # The ids end at the token that completes "fox": the rest of the round is dropped,
    # as one-token rounds (K=0) would have stopped there.
    before = script[0].tokens + script[1].tokens
    n = next(i for i in range(1, len(script[2].tokens) + 1)
             if "fox" in tok.decode(before + script[2].tokens[:i]))
    assert n < len(script[2].tokens)
    assert list(chunks[-1].token_ids) == script[2].tokens[:n]
    assert len(chunks[-1].kinds) == len(chunks[-1].token_texts) == n
    assert chunks[-1].stats.generated_tokens == len(before) + n
    # Same text, one token per round: the same ids.
    flat = [t for o in script for t in o.tokens]
    ones = [RoundOutput([t], [A], None if i < len(flat) - 1 else "length")
            for i, t in enumerate(flat)]
    svc1, _ = service(tok, ones)
    ids1 = [t for c in svc1.stream(request(stop=["fox"])) for t in c.token_ids]
    assert ids1 == [t for c in chunks for t in c.token_ids]
    # closed with two rounds left: its sessions are released at once
    assert loop.yielded == 3
    assert loop.closed_early == 1 and loop.exhausted == 0 and loop.ended == 1


def test_stop_string_in_the_last_round(tok):
    script = rounds_of(tok, ["Hello", " world END tail"], reason="eos")
    svc, loop = service(tok, script)
    chunks = list(svc.stream(request(stop=["END"])))
    assert chunks[-1].finish_reason == "stop"
    assert "".join(c.text for c in chunks) == "Hello world "


def test_stop_string_completed_by_the_final_flush(tok):
    """The stop's last character is an incomplete one until the end of the generation."""
    ids = encode(tok, "go 🎉")
    script = [RoundOutput(ids[:-1], [A] * (len(ids) - 1), "length")]
    partial = tok.decode(ids[:-1])[3:]  # what the flush produces after "go "
    svc, _ = service(tok, script)
    resp = svc.generate(request(stop=[partial]))
    assert resp.finish_reason == "stop"
    assert resp.text == "go "


def test_generate_concatenates_the_stream(tok):
    pieces = ["Café", " naïve", " 你好", "，世界", " STO", "P here", " more"]
    script = rounds_of(tok, pieces, reason="length")
    script[3] = RoundOutput(script[3].tokens, [R] * len(script[3].tokens), None)
    for stop in ([], ["STOP"], ["世界"]):
        svc, _ = service(tok, script, stats=dict(drafted_tokens=4))
        chunks = list(svc.stream(request(stop=stop)))
        svc2, loop2 = service(tok, script, stats=dict(drafted_tokens=4))
        resp = svc2.generate(request(stop=stop))
        assert resp.text == "".join(c.text for c in chunks)
        assert list(resp.token_ids) == [t for c in chunks for t in c.token_ids]
        assert list(resp.kinds) == [k for c in chunks for k in c.kinds]
        assert resp.finish_reason == chunks[-1].finish_reason
        assert resp.stats == chunks[-1].stats
    assert resp.text == "Café naïve 你好，"
    assert resp.finish_reason == "stop"
    assert loop2.closed_early == 1


def test_generate_without_stop_returns_the_whole_text(tok):
    pieces = ["Café", " naïve", " 你好", "，世界", " STO", "P here"]
    svc, _ = service(tok, rounds_of(tok, pieces, reason="eos"))
    resp = svc.generate(request())
    assert resp.text == "".join(pieces)
    assert resp.finish_reason == "eos"
    assert resp.stats.prompt_tokens == len(encode(tok, "Hello"))


def test_closing_the_stream_closes_the_loop(tok):
    script = rounds_of(tok, ["a", "b", "c", "d"])
    svc, loop = service(tok, script)
    it = svc.stream(request())
    next(it)
    next(it)
    assert loop.ended == 0
    it.close()
    assert loop.yielded == 2
    assert loop.closed_early == 1 and loop.ended == 1 and loop.exhausted == 0


def test_nan_seconds_become_zero(tok):
    svc, _ = service(tok, rounds_of(tok, ["x"]), stats=dict(seconds=math.nan))
    assert svc.generate(request()).stats.seconds == 0.0


# -- concurrency ---------------------------------------------------------------------


def test_concurrency_limit(tok):
    script = rounds_of(tok, ["one", " two", " three"])
    svc, loop = service(tok, script)
    first = svc.stream(request())
    assert next(first).text == "one"
    with pytest.raises(ResourceExhausted) as e:
        svc.generate(request())
    assert e.value.code == "RESOURCE_EXHAUSTED"
    second = svc.stream(request())
    with pytest.raises(ResourceExhausted):
        next(second)
    assert loop.started == 1
    first.close()
    assert svc.generate(request()).text == "one two three"
    assert svc.generate(request()).text == "one two three"  # the slot came back again


def test_exhausted_stream_frees_its_slot(tok):
    svc, _ = service(tok, rounds_of(tok, ["a", "b"]))
    assert len(list(svc.stream(request()))) == 2
    assert len(list(svc.stream(request()))) == 2


def test_stopped_stream_frees_its_slot(tok):
    svc, _ = service(tok, rounds_of(tok, ["a", "STOP", "b"]))
    assert svc.generate(request(stop=["STOP"])).finish_reason == "stop"
    assert svc.generate(request()).text == "aSTOPb"


def test_rejected_request_takes_no_slot(tok):
    svc, _ = service(tok, rounds_of(tok, ["a"]))
    for _ in range(3):
        with pytest.raises(InvalidArgument):
            svc.generate(request(max_new_tokens=0))
    assert svc.generate(request()).text == "a"


def test_loop_error_frees_the_slot(tok):
    class Boom(Exception):
        pass

    class FailingLoop(FakeLoop):
        def rounds(self, *args, **kwargs):
            yield from super().rounds(*args)
            raise Boom()

    loop = FailingLoop(rounds_of(tok, ["a", "b"], reason=None))
    svc = GenerationService(loop, tok, LIMITS, [IM_END])
    with pytest.raises(Boom):
        svc.generate(request())
    loop.script = rounds_of(tok, ["c"], reason=None)
    with pytest.raises(Boom):
        svc.generate(request())  # not ResourceExhausted: the slot was released


def test_concurrency_two(tok):
    limits = Limits(768, 64, 8, max_concurrency=2)
    svc, _ = service(tok, rounds_of(tok, ["a", "b"]), limits=limits)
    s1, s2, s3 = svc.stream(request()), svc.stream(request()), svc.stream(request())
    next(s1)
    next(s2)
    with pytest.raises(ResourceExhausted):
        next(s3)
    s2.close()
    assert svc.generate(request()).text == "ab"
    s1.close()


def test_token_texts_give_each_token_its_text(tok):
    """One text per token; joined they are the chunk's text, with multi-byte characters
    split across tokens, stop strings and the final flush."""
    pieces = ["Café", " naïve", " 你好", "，世界", " 🚀", " STO", "P here"]
    script = rounds_of(tok, pieces, reason="length")
    for stop in ([], ["STOP"], ["世界"]):
        svc, _ = service(tok, script)
        chunks = list(svc.stream(request(stop=stop)))
        for chunk in chunks:
            assert len(chunk.token_texts) == len(chunk.token_ids)
            assert "".join(chunk.token_texts) == chunk.text
        resp = service(tok, script)[0].generate(request(stop=stop))
        assert list(resp.token_texts) == [t for c in chunks for t in c.token_texts]
    # without stop strings each token's text is what decoding the ids so far adds
    svc, _ = service(tok, script)
    texts = [t for c in svc.stream(request()) for t in c.token_texts]
    ids = [t for o in script for t in o.tokens]
    assert "".join(texts) == "".join(pieces)
    assert texts[0] == tok.decode(ids[:1])
