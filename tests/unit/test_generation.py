"""coordinator.generation: request validation and streaming over a scripted fake loop."""

from __future__ import annotations

import math

import pytest

from coordinator.generation import MAX_STOP_CHARS, MAX_STOP_STRINGS, GenerationService, Limits
from coordinator.loop import LoopStats, RoundOutput
from specdec.errors import InvalidArgument, ResourceExhausted
from specdec.runtime.tiny_tokenizer import build
from specdec.sampling import SamplingParams
from specdec.v1 import common_pb2, generate_pb2
from specdec.verify import TokenKind

A, R, B, T = TokenKind.ACCEPTED, TokenKind.RECOVERED, TokenKind.BONUS, TokenKind.TARGET
IM_START, IM_END = 1, 2
LIMITS = Limits(vocab_size=768, max_context=64, max_draft_tokens=8, default_k=4,
                max_new_tokens_cap=100, max_concurrency=1)


@pytest.fixture(scope="module")
def tok():
    return build(768)


def encode(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


class FakeLoop:
    """Yields the scripted rounds; records calls and how its generators ended."""

    def __init__(self, script: list[RoundOutput], stats: dict | None = None):
        self.script = script
        self.stats = stats or {}
        self.calls: list[dict] = []
        self.started = 0
        self.exhausted = 0
        self.closed_early = 0  # closed at a yield (GeneratorExit)
        self.yielded = 0
        self.ended = 0  # finally blocks run

    def rounds(self, prompt_ids, max_new_tokens, sampling, k, eos_ids, stats):
        self.calls.append(dict(prompt_ids=list(prompt_ids), max_new_tokens=max_new_tokens,
                               sampling=sampling, k=k, eos_ids=list(eos_ids)))
        assert isinstance(stats, LoopStats)
        self.started += 1
        try:
            for out in self.script:
                stats.rounds += 1
                for key, value in self.stats.items():
                    setattr(stats, key, value)
                self.yielded += 1
                yield out
            self.exhausted += 1
        except GeneratorExit:
            self.closed_early += 1
            raise
        finally:
            self.ended += 1


def rounds_of(tok, pieces: list[str], reason: str = "length", kind=A) -> list[RoundOutput]:
    """One round per piece of text (encoded alone), the last with `reason`."""
    out = []
    for i, piece in enumerate(pieces):
        ids = encode(tok, piece)
        out.append(RoundOutput(ids, [kind] * len(ids),
                               reason if i == len(pieces) - 1 else None))
    return out


def service(tok, script=(), limits=LIMITS, stats=None, eos=(IM_END,)):
    loop = FakeLoop(list(script), stats)
    return GenerationService(loop, tok, limits, list(eos)), loop


def request(**kw) -> generate_pb2.GenerateRequest:
    """A valid request ("Hello", 10 tokens) unless kw says otherwise (no_prompt=True: none)."""
    kw.setdefault("max_new_tokens", 10)
    no_prompt = kw.pop("no_prompt", False)
    if not no_prompt and not any(k in kw for k in ("prompt", "messages", "prompt_token_ids")):
        kw["prompt"] = "Hello"
    return generate_pb2.GenerateRequest(**kw)


def msg(role, content):
    return generate_pb2.ChatMessage(role=role, content=content)


# -- plan: invalid requests ----------------------------------------------------------

BAD = {
    "nothing": (dict(no_prompt=True), "prompt"),
    "empty prompt": (dict(prompt="", max_new_tokens=5), "prompt"),
    "prompt and messages": (dict(prompt="hi", messages=[msg("user", "hi")]), "messages"),
    "prompt and ids": (dict(prompt="hi", prompt_token_ids=[5, 6]), "prompt_token_ids"),
    "messages and ids": (dict(messages=[msg("user", "hi")], prompt_token_ids=[5]),
                         "prompt_token_ids"),
    "all three": (dict(prompt="hi", messages=[msg("user", "x")], prompt_token_ids=[5]),
                  "exactly one"),
    "max_new_tokens 0": (dict(prompt="hi", max_new_tokens=0), "max_new_tokens"),
    "max_new_tokens negative": (dict(prompt="hi", max_new_tokens=-3), "max_new_tokens"),
    "max_new_tokens over cap": (dict(prompt="hi", max_new_tokens=101), "max_new_tokens"),
    "negative temperature": (
        dict(sampling=common_pb2.SamplingParams(temperature=-0.5)), "sampling.temperature"),
    "nan temperature": (
        dict(sampling=common_pb2.SamplingParams(temperature=math.nan)), "sampling.temperature"),
    "inf temperature": (
        dict(sampling=common_pb2.SamplingParams(temperature=math.inf)), "sampling.temperature"),
    "negative top_k": (dict(sampling=common_pb2.SamplingParams(top_k=-1)), "sampling.top_k"),
    "top_p above 1": (dict(sampling=common_pb2.SamplingParams(top_p=1.5)), "sampling.top_p"),
    "negative top_p": (dict(sampling=common_pb2.SamplingParams(top_p=-0.1)), "sampling.top_p"),
    "num_draft_tokens -1": (dict(num_draft_tokens=-1), "num_draft_tokens"),
    "num_draft_tokens 9": (dict(num_draft_tokens=9), "num_draft_tokens"),
    "too many stops": (dict(stop=["x"] * (MAX_STOP_STRINGS + 1)), "stop"),
    "stop too long": (dict(stop=["x" * (MAX_STOP_CHARS + 1)]), "stop"),
    "unknown role": (dict(messages=[msg("user", "hi"), msg("robot", "beep")]),
                     "messages[1].role"),
    "empty role": (dict(messages=[msg("", "hi")]), "messages[0].role"),
    "id = vocab": (dict(prompt_token_ids=[5, 768]), "prompt_token_ids"),
    "negative id": (dict(prompt_token_ids=[-1, 5]), "prompt_token_ids"),
    "huge id": (dict(prompt_token_ids=[10**6]), "prompt_token_ids"),
    "prompt fills context": (dict(prompt_token_ids=[5] * 64), "prompt"),
    "prompt beyond context": (dict(prompt_token_ids=[5] * 80), "prompt"),
    "text prompt fills context": (dict(prompt="a" * 200), "prompt"),
}


@pytest.mark.parametrize("kw, field", BAD.values(), ids=list(BAD))
def test_plan_rejects(tok, kw, field):
    svc, loop = service(tok)
    with pytest.raises(InvalidArgument) as e:
        svc.plan(request(**kw))
    assert field in e.value.message
    assert e.value.code == "INVALID_ARGUMENT"
    # stream/generate refuse the same way and never reach the loop
    with pytest.raises(InvalidArgument):
        svc.generate(request(**kw))
    assert loop.calls == []


def test_plan_names_the_bad_ids_and_the_context(tok):
    svc, _ = service(tok)
    with pytest.raises(InvalidArgument, match=r"\[800, 900\]"):
        svc.plan(request(prompt_token_ids=[5, 800, 6, 900]))
    with pytest.raises(InvalidArgument, match="64 tokens.*context is 64"):
        svc.plan(request(prompt_token_ids=[5] * 64))


def test_plan_without_tokenizer_needs_ids():
    svc = GenerationService(FakeLoop([]), None, LIMITS, [])
    with pytest.raises(InvalidArgument, match="prompt_token_ids"):
        svc.plan(request(prompt="hi"))
    assert svc.plan(request(prompt_token_ids=[5, 6])).prompt_ids == [5, 6]


# -- plan: valid requests ------------------------------------------------------------


def test_plan_text_prompt(tok):
    svc, _ = service(tok)
    plan = svc.plan(request(prompt="Hello, world!", max_new_tokens=7, stop=["\n", "END"],
                            sampling=common_pb2.SamplingParams(temperature=0.7, top_k=5,
                                                               top_p=0.9, seed=123)))
    assert plan.prompt_ids == encode(tok, "Hello, world!")
    assert plan.max_new_tokens == 7
    assert plan.stop == ["\n", "END"]
    assert plan.sampling.top_k == 5 and plan.sampling.seed == 123
    assert plan.sampling.temperature == pytest.approx(0.7)
    assert plan.sampling.top_p == pytest.approx(0.9)


def test_plan_chat_messages_use_the_template(tok):
    svc, _ = service(tok)
    plan = svc.plan(request(messages=[msg("system", "be brief"), msg("user", "hi"),
                                      msg("assistant", "hello"), msg("user", "again")]))
    ids = plan.prompt_ids
    tail = encode(tok, "assistant\n")
    assert ids[0] == IM_START
    assert ids[-len(tail) - 1:] == [IM_START] + tail
    assert ids.count(IM_START) == 5 and ids.count(IM_END) == 4
    text = tok.decode(ids)
    assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain"
                    "<|im_end|>\n<|im_start|>assistant\n")


def test_plan_prompt_token_ids_pass_through(tok):
    svc, _ = service(tok)
    ids = [0, 1, 2, 767, 300]
    assert svc.plan(request(prompt_token_ids=ids)).prompt_ids == ids


def test_plan_default_k(tok):
    svc, _ = service(tok)
    assert svc.plan(request()).k == LIMITS.default_k == 4
    assert svc.plan(request(num_draft_tokens=0)).k == 0
    assert svc.plan(request(num_draft_tokens=8)).k == 8


def test_plan_default_k_limited_by_the_draft(tok):
    svc, _ = service(tok, limits=Limits(768, 64, max_draft_tokens=2, default_k=4))
    assert svc.plan(request()).k == 2
    with pytest.raises(InvalidArgument, match="num_draft_tokens"):
        svc.plan(request(num_draft_tokens=3))
    no_draft, _ = service(tok, limits=Limits(768, 64, max_draft_tokens=0, default_k=0))
    assert no_draft.plan(request()).k == 0
    with pytest.raises(InvalidArgument, match="num_draft_tokens"):
        no_draft.plan(request(num_draft_tokens=1))


@pytest.mark.parametrize("n_prompt, asked, expected", [
    (60, 10, 4), (63, 100, 1), (10, 54, 54), (10, 55, 54), (1, 100, 63), (5, 3, 3),
])
def test_plan_clamps_max_new_tokens_to_the_context(tok, n_prompt, asked, expected):
    svc, _ = service(tok)
    plan = svc.plan(request(prompt_token_ids=[5] * n_prompt, max_new_tokens=asked))
    assert plan.max_new_tokens == expected


def test_plan_accepts_limits_at_the_edges(tok):
    svc, _ = service(tok)
    n = len(encode(tok, "Hello"))
    assert svc.plan(request(max_new_tokens=100)).max_new_tokens == 64 - n
    plan = svc.plan(request(prompt_token_ids=[767] * 63, max_new_tokens=1,
                            stop=["y" * MAX_STOP_CHARS] * MAX_STOP_STRINGS,
                            sampling=common_pb2.SamplingParams(top_p=1.0, seed=2**64 - 1)))
    assert plan.max_new_tokens == 1
    assert len(plan.stop) == MAX_STOP_STRINGS


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
    assert list(chunks[-1].token_ids) == script[2].tokens
    assert chunks[-1].stats.generated_tokens == sum(len(o.tokens) for o in script[:3])
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
        def rounds(self, *args):
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
