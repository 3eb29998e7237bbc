"""Errors in OpenAI's shape, and the checks of request values that raise them.

`APIError` is what the HTTP layer answers ({"error": {message, type, param, code}});
`from_exception` turns any failure of a generation into one (a domain error's gRPC
status becomes its HTTP status, the GenerateRequest field its message names becomes
the OpenAI parameter); `bad` is a 400. The value checks (`number`, `is_int`,
`check_unicode`) are what coordinator.api.openai_api validates a body with.
"""

from __future__ import annotations

import math

from specdec.errors import SpecdecError

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
                  "sampling.presence_penalty": "presence_penalty",
                  "sampling.frequency_penalty": "frequency_penalty",
                  "sampling.repetition_penalty": "repetition_penalty",
                  "sampling.min_p": "min_p", "sampling.logit_bias": "logit_bias",
                  "sampling.grammar": "response_format",
                  "logprobs": "logprobs",
                  "prompt_token_ids": "prompt", "alpha": "contrastive.alpha",
                  "beta": "contrastive.beta",
                  "amateur_temperature": "contrastive.amateur_temperature"}
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
        field = exc.message.split(" ", 1)[0].split("[", 1)[0].rstrip(":")
        return APIError(status, exc.message, type_, SERVICE_FIELDS.get(field),
                        exc.code.lower())
    return APIError(500, f"internal error ({type(exc).__name__}); see the server log",
                    "server_error", code="internal_error")


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def number(body: dict, name: str, default: float, param: str | None = None) -> float:
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


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _surrogate(text: str) -> str | None:
    """The first lone surrogate in `text` (JSON's \\ud800 escapes decode to one), if any:
    such a string has no UTF-8 form, so no tokenizer or protobuf field can take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def check_unicode(body: dict) -> None:
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
