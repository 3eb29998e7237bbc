"""Shared helpers for the coordinator.api.service tests: a scripted fake loop, requests."""

from __future__ import annotations

import pytest

from coordinator.api.service import GenerationService, Limits
from coordinator.loop import LoopStats, RoundOutput
from specdec.runtime.tiny_tokenizer import build
from specdec.v1 import generate_pb2
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
        self.draft = object()  # a draft is configured (None: target-only)

    def rounds(self, prompt_ids, max_new_tokens, sampling, k, eos_ids, stats,
               load_aware=False, contrastive=None, tenant=None, logprobs=None,
               prompt_logprobs=False, prediction=(), guide=None):
        self.calls.append(dict(prompt_ids=list(prompt_ids), max_new_tokens=max_new_tokens,
                               sampling=sampling, k=k, eos_ids=list(eos_ids), tenant=tenant,
                               guide=guide))
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
