"""coordinator.api.text: incremental detokenization (real byte-level BPE)."""

from __future__ import annotations

import random

import pytest
import torch

from coordinator.api.text import REPLACEMENT, IncrementalDetokenizer
from specdec.runtime.tiny_tokenizer import build

VOCAB = 768
IM_END = 2
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, façade, Straße, Ærø, crème brûlée.",
    "你好，世界",
    "你好，世界。 こんにちは。 안녕하세요.",
    "🙂👍🚀",
    "🎉😀🤖✨",
    "mixed: naïve 你好 🚀 ok → ∞ € done",
    "   three leading spaces",
    " one leading space",
    "line one\nline two\n\n  indented\n",
    "\n\nstarts with newlines",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم",
    "def f(x):\n    return {\"a\": x[1:]}  # comment",
    "Numbers 3.14159 2026-11-29 12:30 and 42!",
    "a",
    "Ω⁂ rare symbols ⁂Ω",
]


@pytest.fixture(scope="module")
def tok():
    return build(VOCAB)


def encode(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def decode(tok, ids) -> str:
    return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def random_groups(ids: list[int], rng: random.Random, max_size: int = 4) -> list[list[int]]:
    groups, i = [], 0
    while i < len(ids):
        n = rng.randint(1, max_size)
        groups.append(ids[i:i + n])
        i += n
    return groups


def feed(detok: IncrementalDetokenizer, groups) -> tuple[list[str], str]:
    """All add() outputs and the flush() output."""
    return [detok.add(g) for g in groups], detok.flush()


# -- IncrementalDetokenizer: ordinary text -------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_one_id_at_a_time_reassembles_the_text(tok, text):
    ids = encode(tok, text)
    assert tok.decode(ids) == text  # the tokenizer round-trips these texts
    deltas, tail = feed(IncrementalDetokenizer(tok), [[i] for i in ids])
    assert "".join(deltas) + tail == tok.decode(ids)
    for d in deltas + [tail]:
        assert REPLACEMENT not in d, (text, deltas)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("seed", range(5))
def test_random_groups_reassemble_the_text(tok, text, seed):
    ids = encode(tok, text)
    rng = random.Random(seed * 1000 + len(text))
    deltas, tail = feed(IncrementalDetokenizer(tok), random_groups(ids, rng))
    assert "".join(deltas) + tail == tok.decode(ids)
    assert all(REPLACEMENT not in d for d in deltas + [tail]), deltas


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_are_prefixes_of_the_final_text(tok, text):
    """What is streamed is never taken back: each running total is a prefix of the text."""
    ids = encode(tok, text)
    full = tok.decode(ids)
    detok = IncrementalDetokenizer(tok)
    so_far = ""
    for i in ids:
        so_far += detok.add([i])
        assert full.startswith(so_far)
    assert so_far + detok.flush() == full


def test_all_ids_in_one_add(tok):
    text = TEXTS[7]
    ids = encode(tok, text)
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids) == text
    assert detok.flush() == ""


def test_empty_add_returns_nothing(tok):
    detok = IncrementalDetokenizer(tok)
    assert detok.add([]) == ""
    assert detok.add(encode(tok, "ok")) == "ok"
    assert detok.add([]) == ""
    assert detok.flush() == ""


# -- multi-byte characters split over tokens -----------------------------------------


def split_emoji(tok, min_ids: int) -> tuple[str, list[int]]:
    for ch in "🎉😀🤖👍🚀✨→Ω🙂":
        ids = encode(tok, ch)
        if len(ids) >= min_ids and all(REPLACEMENT in tok.decode([i]) for i in ids):
            return ch, ids
    raise AssertionError(f"no character of the tiny tokenizer splits into {min_ids}+ ids")


@pytest.mark.parametrize("min_ids", [2, 3])
def test_split_character_is_emitted_only_when_complete(tok, min_ids):
    ch, ids = split_emoji(tok, min_ids)
    detok = IncrementalDetokenizer(tok)
    for i in ids[:-1]:
        assert detok.add([i]) == ""
    assert detok.add([ids[-1]]) == ch
    assert detok.flush() == ""


def test_split_character_after_text_releases_the_text_first(tok):
    ch, ids = split_emoji(tok, 3)
    head = encode(tok, "go ")
    detok = IncrementalDetokenizer(tok)
    assert detok.add(head) == "go "
    assert detok.add(ids[:1]) == ""
    assert detok.add(ids[1:2]) == ""
    assert detok.add(ids[2:] + head) == ch + "go "


def test_flush_releases_an_incomplete_character(tok):
    ch, ids = split_emoji(tok, 2)
    detok = IncrementalDetokenizer(tok)
    assert detok.add(encode(tok, "x")) == "x"
    assert detok.add(ids[:1]) == ""
    tail = detok.flush()
    assert tail == tok.decode(ids[:1])
    assert tail.endswith(REPLACEMENT)


# -- random ids ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_random_ids_reassemble_decode(tok, seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 60, (1,), generator=g))
    ids = torch.randint(0, VOCAB, (n,), generator=g).tolist()
    rng = random.Random(seed)
    for groups in ([[i] for i in ids], random_groups(ids, rng, 5)):
        deltas, tail = feed(IncrementalDetokenizer(tok), groups)
        assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=True), ids


@pytest.mark.parametrize("seed", range(20))
def test_random_byte_ids_reassemble_decode(tok, seed):
    """Only single-byte tokens (ids 3..258): many broken and split UTF-8 sequences."""
    g = torch.Generator().manual_seed(1000 + seed)
    ids = torch.randint(3, 259, (40,), generator=g).tolist()
    deltas, tail = feed(IncrementalDetokenizer(tok), [[i] for i in ids])
    assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=True), ids


# -- prompt context ------------------------------------------------------------------

PROMPT_CASES = [
    ("Tell me a story:", " Once upon a time, there was a fox."),
    ("Say hello", "\n\nHello, world!"),
    ("Translate to Chinese: hello world", " 你好，世界"),
    ("Emoji please", " 🙂👍🚀 done"),
    ("Le café", " est naïve, façade crème brûlée."),
    ("trailing space ", "and more words"),
]


@pytest.mark.parametrize("prompt, completion", PROMPT_CASES)
@pytest.mark.parametrize("grouped", [False, True])
def test_deltas_after_a_prompt(tok, prompt, completion, grouped):
    prompt_ids = encode(tok, prompt)
    gen = encode(tok, completion)
    expected = decode(tok, prompt_ids + gen)[len(decode(tok, prompt_ids)):]
    groups = random_groups(gen, random.Random(7)) if grouped else [[i] for i in gen]
    deltas, tail = feed(IncrementalDetokenizer(tok, prompt_ids), groups)
    assert "".join(deltas) + tail == expected
    assert expected.strip() == completion.strip()  # the case is meaningful


def test_prompt_context_is_not_emitted(tok):
    prompt_ids = encode(tok, "a rather long prompt with many tokens in it")
    detok = IncrementalDetokenizer(tok, prompt_ids)
    assert detok.add(encode(tok, " ok")) == " ok"
    assert detok.flush() == ""


def test_prompt_ending_mid_character_is_not_echoed(tok):
    """A prompt of raw ids may end inside a character; none of its text is streamed (the
    case where tokenizers' DecodeStream differs: it echoes the prompt's last ids)."""
    ch, ids = split_emoji(tok, 2)
    prompt_ids = encode(tok, "Say go") + ids[:1]
    gen = ids[1:] + encode(tok, " ok")
    deltas, tail = feed(IncrementalDetokenizer(tok, prompt_ids), [[i] for i in gen])
    out = "".join(deltas) + tail
    assert "go" not in out and "ay" not in out, out
    assert out.endswith(" ok"), out


def test_chat_prompt_context(tok):
    prompt_ids = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                         tokenize=True, add_generation_prompt=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys"):
        prompt_ids = prompt_ids["input_ids"]
    gen = encode(tok, "Hello! 你好") + [IM_END]
    deltas, tail = feed(IncrementalDetokenizer(tok, prompt_ids), [[i] for i in gen])
    assert "".join(deltas) + tail == "Hello! 你好"


# -- special tokens ------------------------------------------------------------------


def test_special_tokens_are_skipped(tok):
    a, b = encode(tok, "Hello"), encode(tok, " world")
    detok = IncrementalDetokenizer(tok)
    out = [detok.add(a), detok.add([IM_END]), detok.add(b), detok.add([IM_END, 0, 1])]
    assert out == ["Hello", "", " world", ""]
    assert detok.flush() == ""
    assert "im_end" not in "".join(out)


def test_special_token_inside_a_split_character(tok):
    ch, ids = split_emoji(tok, 2)
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[:1]) == ""
    assert detok.add([IM_END]) == ""
    assert detok.add(ids[1:]) == ch
