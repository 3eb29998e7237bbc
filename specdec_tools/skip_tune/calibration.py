"""Calibration text: what the target itself generates greedily from calibration prompts.

A greedy speculative round accepts a draft token exactly when it equals the target's
greedy choice, so the text a draft must predict is the target's own greedy output. The
prompts are the shipped benchmark prompts (specdec_tools.bench.prompts) in the model's chat
template; the generation stops at the token budget or an end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass


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
    from specdec_tools.bench.scenarios import chat_text

    return [tokenizer.encode(chat_text(tokenizer, m), add_special_tokens=False)
            for m in messages]


def eos_ids(tokenizer) -> set[int]:
    ids = getattr(tokenizer, "eos_token_id", None)
    return set(ids if isinstance(ids, list) else [] if ids is None else [ids])


def build(backend, tokenizer, messages: Iterable[str], max_new_tokens: int,
          progress=None) -> Calibration:
    """The target's greedy continuation of each message (the bench's in-process target
    decoding loop, on a specdec.runtime backend)."""
    from specdec.sampling import SamplingParams
    from specdec_tools.bench.scenarios import InProcessTarget

    target = InProcessTarget(backend, tokenizer, eos_ids(tokenizer))
    sequences = []
    for message in messages:
        ids = prompt_ids(tokenizer, [message])[0]
        generated = target.run(message, max_new_tokens, SamplingParams()).token_ids
        sequences.append(Sequence(tuple(ids), tuple(generated)))
        if progress is not None:
            progress.update(1)
    return Calibration(tuple(sequences))


__all__ = ["Calibration", "Sequence", "asdict", "build", "prompt_ids"]
