"""A GenerateRequest from keyword arguments: the options both clients take.

An option left at its default is left unset on the wire, which is what the server
reads as its own default: temperature 0 is greedy, top_k 0 and top_p 0 are off, seed 0
is the seed (every random draw derives from it, so equal requests give equal text),
and num_draft_tokens None lets the coordinator choose K. The server validates
everything; a bad value comes back as InvalidArgumentError with its message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict

from specdec.v1 import common_pb2, generate_pb2

# The server has no default for max_new_tokens (0 is invalid); this is the CLI's.
DEFAULT_MAX_NEW_TOKENS = 128

Message = Mapping[str, str] | tuple[str, str]


class GenerateOptions(TypedDict, total=False):
    """The keyword options of Client/AsyncClient generate() and stream()."""

    messages: Iterable[Message] | None
    prompt_token_ids: Sequence[int] | None
    max_new_tokens: int
    temperature: float
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: Iterable[str]
    num_draft_tokens: int | None
    decoding: str
    alpha: float | None
    beta: float | None
    amateur_temperature: float | None
    formulation: str | None
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    min_p: float
    logit_bias: Mapping[int, float] | None
    logprobs: int | None
    prompt_logprobs: bool
    prediction: str
    structured_output: Mapping[str, object] | None


# The names of the decoding modes and contrastive formulations, everywhere a person writes
# one (client options, the CLI, the HTTP API); specdec.contrastive uses the same names.
DECODINGS = {"speculative": generate_pb2.DECODING_SPECULATIVE,
             "contrastive": generate_pb2.DECODING_CONTRASTIVE}
FORMULATIONS = {"obrien": common_pb2.CONTRASTIVE_FORMULATION_OBRIEN,
                "li": common_pb2.CONTRASTIVE_FORMULATION_LI}


def build_request(prompt: str | None = None, *, messages: Iterable[Message] | None = None,
                  prompt_token_ids: Sequence[int] | None = None,
                  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, temperature: float = 0.0,
                  top_p: float | None = None, top_k: int | None = None,
                  seed: int | None = None, stop: Iterable[str] = (),
                  num_draft_tokens: int | None = None, decoding: str = "speculative",
                  alpha: float | None = None, beta: float | None = None,
                  amateur_temperature: float | None = None,
                  formulation: str | None = None, presence_penalty: float = 0.0,
                  frequency_penalty: float = 0.0, repetition_penalty: float = 1.0,
                  min_p: float = 0.0, logit_bias: Mapping[int, float] | None = None,
                  logprobs: int | None = None, prompt_logprobs: bool = False,
                  prediction: str = "",
                  structured_output: Mapping[str, object] | None = None,
                  ) -> generate_pb2.GenerateRequest:
    """The request for one generation.

    Give exactly one of `prompt` (raw text), `messages` (chat turns through the model's
    chat template: {"role": ..., "content": ...} dicts or (role, content) tuples, roles
    "system", "user" or "assistant") and `prompt_token_ids`.

    max_new_tokens: most tokens to generate (the server caps it, 4096 by default).
    temperature: 0 = greedy; top_k: keep the k most likely tokens (None or 0 = off);
    top_p: keep the smallest set with mass >= top_p (None, 0 or 1 = off); seed: of
    every random draw (None = 0). stop: strings that end the generation (cut from the
    text). num_draft_tokens: K draft tokens per round, 0 = target only, None = the
    coordinator's default (which may vary it with load).

    decoding: "speculative" (the target's distribution) or "contrastive" (the target as
    expert, the draft as amateur; num_draft_tokens 0 is its plain form, K > 0 its
    speculative form). alpha, beta, amateur_temperature and formulation ("obrien" or
    "li") tune contrastive decoding (None = the server's default: 0.1, 0.5, 1, obrien).

    Speculation stays on with all of these: presence_penalty and frequency_penalty
    (OpenAI's, [-2, 2], over the generated tokens), repetition_penalty (HF's, (0, 2], 1 =
    off), min_p (0 = off), logit_bias ({token id: bias in [-100, 100]}). logprobs: each
    token's raw log-probability and this many alternatives (0-20; None = none);
    prompt_logprobs: the prompt's too (then max_new_tokens may be 0). prediction: text
    the output is expected to resemble (Predicted Outputs; the look-up drafts from it).
    structured_output: the text must match one of {"json": a JSON schema (a dict or JSON
    text)}, {"json_object": True} (any object), {"regex": ...}, {"choice": [strings]},
    {"grammar": Lark or GBNF text}; both services mask with it, speculation stays on.
    """
    request = generate_pb2.GenerateRequest(
        max_new_tokens=max_new_tokens, stop=_strings(stop),
        sampling=common_pb2.SamplingParams(temperature=temperature, top_k=top_k or 0,
                                           top_p=top_p or 0.0, seed=seed or 0,
                                           presence_penalty=presence_penalty,
                                           frequency_penalty=frequency_penalty,
                                           repetition_penalty=0.0 if repetition_penalty == 1.0
                                           else repetition_penalty, min_p=min_p,
                                           logit_bias=dict(logit_bias or {})),
        logprobs=logprobs, prompt_logprobs=prompt_logprobs, prediction=prediction)
    if prompt is not None:
        request.prompt = prompt
    if messages is not None:
        request.messages.extend(_chat_message(m) for m in messages)
    if prompt_token_ids is not None:
        request.prompt_token_ids.extend(prompt_token_ids)
    if num_draft_tokens is not None:
        request.num_draft_tokens = num_draft_tokens
    if decoding not in DECODINGS:
        raise ValueError(f"decoding must be one of {', '.join(DECODINGS)}, got {decoding!r}")
    request.decoding = DECODINGS[decoding]
    tuning = {"alpha": alpha, "beta": beta, "amateur_temperature": amateur_temperature}
    for name, value in tuning.items():
        if value is not None:
            setattr(request.contrastive, name, value)
    if formulation is not None:
        if formulation not in FORMULATIONS:
            raise ValueError(f"formulation must be one of {', '.join(FORMULATIONS)}, "
                             f"got {formulation!r}")
        request.contrastive.formulation = FORMULATIONS[formulation]
    if structured_output is not None:
        request.sampling.grammar.CopyFrom(grammar_message(structured_output))
    return request


GRAMMAR_KINDS = {"json": common_pb2.Grammar.KIND_JSON_SCHEMA,
                 "json_object": common_pb2.Grammar.KIND_JSON_OBJECT,
                 "regex": common_pb2.Grammar.KIND_REGEX,
                 "choice": common_pb2.Grammar.KIND_CHOICE,
                 "grammar": common_pb2.Grammar.KIND_LARK}


def grammar_message(structured_output: Mapping[str, object]) -> common_pb2.Grammar:
    """The wire's Grammar for a `structured_output` option (the server checks that it
    compiles; the digest is the server's to compute)."""
    if not isinstance(structured_output, Mapping) or len(structured_output) != 1 \
            or next(iter(structured_output)) not in GRAMMAR_KINDS:
        raise ValueError("structured_output must have exactly one of "
                         f"{', '.join(GRAMMAR_KINDS)}, got {structured_output!r}")
    (kind, value), = structured_output.items()
    if kind == "json_object":
        if value is not True:
            raise ValueError("structured_output {'json_object': True} asks for any JSON "
                             f"object; got {value!r}")
        return common_pb2.Grammar(kind=GRAMMAR_KINDS[kind])
    if kind in ("json", "choice") and not isinstance(value, str):
        value = json.dumps(value)
    if not isinstance(value, str):
        raise ValueError(f"structured_output[{kind!r}] must be text, got {value!r}")
    return common_pb2.Grammar(kind=GRAMMAR_KINDS[kind], spec=value)


def _strings(stop: Iterable[str]) -> list[str]:
    if isinstance(stop, str):  # one stop string, not its characters
        return [stop]
    return list(stop)


def _chat_message(message: Message) -> generate_pb2.ChatMessage:
    if isinstance(message, Mapping):
        return generate_pb2.ChatMessage(role=message["role"], content=message["content"])
    if isinstance(message, tuple) and len(message) == 2:
        role, content = message
        return generate_pb2.ChatMessage(role=role, content=content)
    raise TypeError("a chat message is a {'role': ..., 'content': ...} dict or a "
                    f"(role, content) tuple, got {message!r}")
