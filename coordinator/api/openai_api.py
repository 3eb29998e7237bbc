"""OpenAI's chat and completion API, translated to and from the Generator API.

Pure functions, no server: an OpenAI request body becomes a `GenerateRequest` (which
`GenerationService` then validates exactly as it validates gRPC requests: one source of
truth for limits, stop strings and sampling), and `GenerateChunk`s become OpenAI's
response and SSE chunk objects. What OpenAI's API has and specdec does not (several
choices, log-probabilities, tools, penalties) is refused with a 400 naming the
parameter, in OpenAI's error shape, rather than silently ignored.

specdec's own fields:
- request extensions (the `openai` package's `extra_body`): `top_k`, `num_draft_tokens`
  (K; 0 = target only), `timeout` (seconds; past it the request ends with 504),
  `decoding` ("speculative" or "contrastive") and `contrastive` ({alpha, beta,
  amateur_temperature, formulation: "obrien" | "li"}; docs/design.md, section 17);
- each chunk (and a unary response) carries `specdec`: the round's token ids, kinds and per-token
  texts (the browser demo colours tokens by kind from these);
- `usage.completion_tokens_details.accepted_prediction_tokens` /
  `rejected_prediction_tokens` are the draft tokens the target accepted / rejected
  (OpenAI's names for predicted-output tokens), and `usage.specdec` has the stats.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from specdec.client.request import DECODINGS, FORMULATIONS
from specdec.errors import SpecdecError
from specdec.v1 import common_pb2, generate_pb2

KIND_NAMES = {generate_pb2.TOKEN_KIND_ACCEPTED: "accepted",
              generate_pb2.TOKEN_KIND_RECOVERED: "recovered",
              generate_pb2.TOKEN_KIND_BONUS: "bonus",
              generate_pb2.TOKEN_KIND_TARGET: "target"}
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
# The gRPC status of a domain error -> (HTTP status, OpenAI error type).
HTTP_STATUS = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "NOT_FOUND": (404, "not_found_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "CANCELLED": (499, "cancelled"),
    "UNAVAILABLE": (503, "service_unavailable"),
    "DEADLINE_EXCEEDED": (504, "timeout"),
    "ABORTED": (409, "conflict"),
}
# GenerationService names the GenerateRequest field first in its messages; the OpenAI
# parameter it came from.
SERVICE_FIELDS = {"max_new_tokens": "max_tokens", "num_draft_tokens": "num_draft_tokens",
                  "sampling.temperature": "temperature", "sampling.top_p": "top_p",
                  "sampling.top_k": "top_k", "sampling.seed": "seed", "stop": "stop",
                  "prompt_token_ids": "prompt", "alpha": "contrastive.alpha",
                  "beta": "contrastive.beta",
                  "amateur_temperature": "contrastive.amateur_temperature"}
INT32_MAX = 2**31 - 1
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send 0 for greedy
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
           "stream_options", "n", "user", "top_k", "num_draft_tokens", "timeout",
           "decoding", "contrastive",
           "logprobs", "presence_penalty", "frequency_penalty", "logit_bias"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                         "tool_choice", "functions", "function_call", "response_format",
                         "parallel_tool_calls", "store", "metadata", "modalities",
                         "prediction", "audio", "reasoning_effort", "service_tier"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = \
            status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def from_exception(exc: BaseException) -> APIError:
    """The APIError for any failure of a generation (unknown ones: 500, no details)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, SpecdecError) and exc.code in HTTP_STATUS:
        status, type_ = HTTP_STATUS[exc.code]
        field = exc.message.split(" ", 1)[0]
        return APIError(status, exc.message, type_, SERVICE_FIELDS.get(field),
                        exc.code.lower())
    return APIError(500, f"internal error ({type(exc).__name__}); see the server log",
                    "server_error", code="internal_error")


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Options:
    """What the HTTP layer needs beyond the GenerateRequest."""

    stream: bool
    include_usage: bool
    timeout_s: float | None


# -- requests ----------------------------------------------------------------------------


def chat_request(body, model: str) -> tuple[generate_pb2.GenerateRequest, Options]:
    body = _object(body, CHAT_FIELDS)
    req, opts = _common(body, model)
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad(f"`{name}` is not supported: specdec does not call tools", name,
                      "unsupported_parameter")
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise bad(f"`{name}` is not supported: specdec does not call tools", name,
                      "unsupported_parameter")
    if body.get("top_logprobs") is not None:
        raise bad("`top_logprobs` is not supported", "top_logprobs", "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad("only response_format {\"type\": \"text\"} is supported", "response_format",
                  "unsupported_parameter")
    if body.get("prediction") is not None:
        raise bad("`prediction` is not supported: the draft model predicts instead",
                  "prediction", "unsupported_parameter")
    both = [body.get(n) for n in ("max_tokens", "max_completion_tokens")]
    if None not in both and both[0] != both[1]:
        raise bad("max_tokens and max_completion_tokens differ; give one", "max_tokens")
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    _max_tokens(req, body.get(param), param)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("`messages` must be a non-empty list of {role, content} objects",
                  "messages", "missing_required_parameter" if messages is None else
                  "invalid_value")
    for i, m in enumerate(messages):
        req.messages.append(_message(m, i))
    return req, opts


def completion_request(body, model: str) -> tuple[generate_pb2.GenerateRequest, Options]:
    body = _object(body, COMPLETION_FIELDS)
    req, opts = _common(body, model)
    if body.get("echo"):
        raise bad("`echo` is not supported", "echo", "unsupported_parameter")
    if body.get("best_of") not in (None, 1):
        raise bad("`best_of` must be 1: specdec returns one completion", "best_of",
                  "unsupported_parameter")
    if body.get("suffix"):
        raise bad("`suffix` is not supported", "suffix", "unsupported_parameter")
    _max_tokens(req, body.get("max_tokens", 16), "max_tokens")  # OpenAI's default: 16
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        req.prompt = prompt
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        beyond = [t for t in prompt if not 0 <= t <= INT32_MAX]
        if beyond:
            raise bad("`prompt` token ids must be in the model's vocabulary (ids >= 0, "
                      f"below its vocab size); got {beyond[:5]}", "prompt")
        req.prompt_token_ids.extend(prompt)
    else:
        raise bad("`prompt` must be a non-empty string or a list of token ids (one prompt "
                  "per request)", "prompt",
                  "missing_required_parameter" if prompt is None else "invalid_value")
    return req, opts


def _object(body, allowed: set[str]) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    _check_unicode(body)
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(f"unrecognized request argument(s): {', '.join(unknown)}", unknown[0],
                  "unknown_parameter")
    return body


def _common(body: dict, model: str) -> tuple[generate_pb2.GenerateRequest, Options]:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise bad("`model` is required (GET /v1/models lists it)", "model",
                  "missing_required_parameter")
    if name != model:
        raise APIError(404, f"model {name!r} does not exist; this server serves {model!r}",
                       "not_found_error", "model", "model_not_found")
    if body.get("n") not in (None, 1):
        raise bad("`n` must be 1: specdec returns one choice per request", "n",
                  "unsupported_parameter")
    if body.get("logprobs") not in (None, False):
        raise bad("`logprobs` is not supported", "logprobs", "unsupported_parameter")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0) != 0.0:
            raise bad(f"`{name}` is not supported (only 0): a penalty would change the "
                      "distribution speculative decoding preserves", name,
                      "unsupported_parameter")
    if body.get("logit_bias"):
        raise bad("`logit_bias` is not supported", "logit_bias", "unsupported_parameter")
    temperature = _number(body, "temperature", DEFAULT_TEMPERATURE)
    if not 0.0 <= temperature <= 2.0:
        raise bad(f"`temperature` must be in [0, 2], got {temperature}", "temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad(f"`top_p` must be in (0, 1], got {top_p}", "top_p")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad("`seed` must be an integer", "seed")
    top_k = body.get("top_k", 0)
    if not _is_int(top_k) or not 0 <= top_k <= INT32_MAX:
        raise bad("`top_k` must be an integer >= 0 (0 = off)", "top_k")
    req = generate_pb2.GenerateRequest(sampling=common_pb2.SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k,
        seed=(seed % 2**64) if seed is not None else secrets.randbits(63)))
    k = body.get("num_draft_tokens")
    if k is not None:
        if not _is_int(k) or abs(k) > INT32_MAX:
            raise bad("`num_draft_tokens` must be an integer (0 = target only)",
                      "num_draft_tokens")
        req.num_draft_tokens = k
    _decoding(body, req)
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("`stop` must be a string or a list of strings", "stop")
    req.stop.extend(stop)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad("`stream` must be a boolean", "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise bad("`stream_options` must be an object", "stream_options")
    if stream_options and not stream:
        raise bad("`stream_options` is only allowed with stream: true", "stream_options")
    timeout = body.get("timeout")
    if timeout is not None:
        timeout = _number(body, "timeout", 0.0)
        if timeout <= 0:
            raise bad("`timeout` must be > 0 seconds", "timeout")
    return req, Options(stream, bool(stream_options.get("include_usage")), timeout)


def _decoding(body: dict, req: generate_pb2.GenerateRequest) -> None:
    """`decoding` and `contrastive` (the values' ranges are GenerationService's to check)."""
    decoding = body.get("decoding", "speculative")
    if decoding not in DECODINGS:
        raise bad(f"`decoding` must be one of {', '.join(DECODINGS)}, got {decoding!r}",
                  "decoding")
    req.decoding = DECODINGS[decoding]
    cd = body.get("contrastive")
    if cd is None:
        return
    if not isinstance(cd, dict) or set(cd) - {"alpha", "beta", "amateur_temperature",
                                              "formulation"}:
        raise bad("`contrastive` must be an object with alpha, beta, amateur_temperature "
                  "and formulation (each optional)", "contrastive")
    for name in ("alpha", "beta", "amateur_temperature"):
        if cd.get(name) is not None:
            setattr(req.contrastive, name, _number(cd, name, 0.0, f"contrastive.{name}"))
    formulation = cd.get("formulation", "obrien")
    if formulation not in FORMULATIONS:
        raise bad(f"`contrastive.formulation` must be one of {', '.join(FORMULATIONS)}, got "
                  f"{formulation!r}", "contrastive.formulation")
    req.contrastive.formulation = FORMULATIONS[formulation]


def _max_tokens(req: generate_pb2.GenerateRequest, value, param: str) -> None:
    if value is None:
        return  # GenerationService's cap, bounded by the context left after the prompt
    if not _is_int(value) or not 1 <= value <= INT32_MAX:
        raise bad(f"`{param}` must be an integer >= 1", param)
    req.max_new_tokens = value


def _message(m, i: int) -> generate_pb2.ChatMessage:
    if not isinstance(m, dict):
        raise bad(f"messages[{i}] must be an object with role and content", f"messages[{i}]")
    role = m.get("role")
    if role not in ROLES:
        raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}"
                  + (" (tool calls are not supported)" if role in ("tool", "function") else ""),
                  f"messages[{i}].role")
    content = m.get("content")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content[{j}]: only text parts are supported",
                          f"messages[{i}].content", "unsupported_content")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise bad(f"messages[{i}].content must be a string or a list of text parts",
                  f"messages[{i}].content")
    return generate_pb2.ChatMessage(role=ROLES[role], content=content)


def _number(body: dict, name: str, default: float, param: str | None = None) -> float:
    value = body.get(name)
    param = param or name
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"`{param}` must be a finite number", param)
    try:
        number = float(value)  # an integer beyond a double's range overflows
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise bad(f"`{param}` must be a finite number", param)
    return number


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _surrogate(text: str) -> str | None:
    """The first lone surrogate in `text` (JSON's \\ud800 escapes decode to one), if any:
    such a string has no UTF-8 form, so no tokenizer or protobuf field can take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def _check_unicode(body: dict) -> None:
    """400 naming the top-level parameter whose strings (keys included, at any depth)
    hold a lone surrogate; walked without recursion (json.loads allows deep nesting)."""
    for key, value in body.items():
        param = key if _surrogate(key) is None else None  # a name that is itself bad
        todo = [key, value]
        while todo:
            item = todo.pop()
            if isinstance(item, str):
                char = _surrogate(item)
                if char is not None:
                    where = f"`{param}`" if param is not None else "a parameter name"
                    raise bad(f"{where} holds a lone surrogate ({ascii(char)}), which is not "
                              "valid Unicode; send UTF-8 text", param, "invalid_unicode")
            elif isinstance(item, dict):
                todo.extend(item.keys())
                todo.extend(item.values())
            elif isinstance(item, list):
                todo.extend(item)
