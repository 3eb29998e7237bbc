"""Calibration text: what the target itself generates greedily from calibration prompts.

A greedy speculative round accepts a draft token exactly when it equals the target's
greedy choice, so the text a draft must predict is the target's own greedy output. The
prompts are the shipped benchmark prompts (specdec.bench.prompts) in the model's chat
template; the generation stops at the token budget or an end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Sequence:
    prompt: tuple[int, ...]
    generated: tuple[int, ...]

    @property
    def ids(self) -> list[int]:
        return list(self.prompt + self.generated)


@dataclass(frozen=True)
class Calibration:
    sequences: tuple[Sequence, ...]

    @property
    def generated_tokens(self) -> int:
        return sum(len(s.generated) for s in self.sequences)

    def to_json(self) -> list[dict]:
        return [{"prompt": list(s.prompt), "generated": list(s.generated)}
                for s in self.sequences]

    @classmethod
    def from_json(cls, data: Iterable[dict]) -> Calibration:
        return cls(tuple(Sequence(tuple(d["prompt"]), tuple(d["generated"])) for d in data))


def prompt_ids(tokenizer, messages: Iterable[str]) -> list[list[int]]:
    from specdec.bench.scenarios import chat_text

    return [tokenizer.encode(chat_text(tokenizer, m), add_special_tokens=False)
            for m in messages]


def eos_ids(tokenizer) -> set[int]:
    ids = getattr(tokenizer, "eos_token_id", None)
    return set(ids if isinstance(ids, list) else [] if ids is None else [ids])


@torch.inference_mode()
def greedy(backend, prompt: list[int], max_new_tokens: int, stop: set[int]) -> list[int]:
    """The target's greedy continuation of `prompt` (a specdec.runtime backend)."""
    cache = backend.new_cache()
    logits = backend.forward(cache, prompt)
    out: list[int] = []
    while len(out) < max_new_tokens:
        token = int(logits[-1].argmax())
        out.append(token)
        if token in stop:
            break
        logits = backend.forward(cache, [token])
    return out


def build(backend, tokenizer, messages: Iterable[str], max_new_tokens: int,
          progress=None) -> Calibration:
    stop = eos_ids(tokenizer)
    sequences = []
    for ids in prompt_ids(tokenizer, messages):
        sequences.append(Sequence(tuple(ids), tuple(greedy(backend, ids, max_new_tokens,
                                                           stop))))
        if progress is not None:
            progress.update(1)
    return Calibration(tuple(sequences))


__all__ = ["Calibration", "Sequence", "asdict", "build", "greedy", "prompt_ids"]
