"""OpenAI's chat and completion API, translated to and from the Generator API.

Pure functions, no server: an OpenAI request body becomes a `GenerateRequest` (which
`GenerationService` then validates exactly as it validates gRPC requests: one source of
truth for limits, stop strings and sampling), and `GenerateChunk`s become OpenAI's
response and SSE chunk objects. Every sampling parameter keeps speculation on: `n`
(up to MAX_N choices, each a generation of its own with its own seed; they share the
prompt's KV through the services' prefix cache), a batch of completion prompts,
`logprobs` / `top_logprobs`, `echo` (with the prompt's log-probabilities, and
`max_tokens` 0), `presence_penalty`, `frequency_penalty`, `logit_bias`, structured
outputs (`response_format` and vLLM's `structured_outputs` / `guided_*`;
coordinator.api.openai_structured), Predicted Outputs (`prediction`) and function tools
(`tools`, `tool_choice`, `parallel_tool_calls`; coordinator.api.openai_tools). What OpenAI's
API has and specdec does not is refused with a 400 naming the parameter, in
OpenAI's error shape, rather than silently ignored.

specdec's own fields:
- request extensions (the `openai` package's `extra_body`): `top_k`, `min_p`,
  `repetition_penalty` (HF's and vLLM's, in (0, 2]; 1 = off), vLLM's `ignore_eos` and
  `min_tokens` (what load tools such as guidellm send), `num_draft_tokens`
  (K; 0 = target only), `timeout` (seconds; past it the request ends with 504),
  `decoding` ("speculative" or "contrastive") and `contrastive` ({alpha, beta,
  amateur_temperature, formulation: "obrien" | "li"}; docs/design.md, section 17);
- each chunk (and a unary response) carries `specdec`: the round's token ids, kinds and per-token
  texts (the browser demo colours tokens by kind from these);
- `usage.completion_tokens_details.accepted_prediction_tokens` /
  `rejected_prediction_tokens` are OpenAI's Predicted Outputs counts: the prediction's
  tokens that the output took / did not take (0 without a prediction); speculation's own
  counts (drafted, accepted, rounds, ...) are in `usage.specdec`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace

from coordinator.api import openai_tools
from coordinator.api.openai_errors import APIError, bad, check_unicode, is_int, number
from coordinator.api.openai_structured import STRUCTURED_FIELDS, grammar_of
from specdec import wire
from specdec.client.request import DECODINGS, FORMULATIONS
from specdec.logprobs import MAX_TOP_LOGPROBS
from specdec.sampling import derive_seed
from specdec.v1 import common_pb2, generate_pb2

KIND_NAMES = {generate_pb2.TOKEN_KIND_ACCEPTED: "accepted",
              generate_pb2.TOKEN_KIND_RECOVERED: "recovered",
              generate_pb2.TOKEN_KIND_BONUS: "bonus",
              generate_pb2.TOKEN_KIND_TARGET: "target"}
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
INT32_MAX = 2**31 - 1
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send 0 for greedy
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_N = 8  # choices per request (`n`)
MAX_PROMPTS = 32  # prompts in one completions request, times n
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's cap for the completions API's `logprobs`

_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
           "stream_options", "n", "user", "top_k", "num_draft_tokens", "timeout",
           "decoding", "contrastive", "min_p", "repetition_penalty",
           "logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
           "ignore_eos", "min_tokens"} \
    | STRUCTURED_FIELDS
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools",
                         "tool_choice", "functions", "function_call", "response_format",
                         "parallel_tool_calls", "store", "metadata", "modalities",
                         "prediction", "audio", "reasoning_effort", "service_tier"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}


@dataclass(frozen=True)
class Options:
    """What the HTTP layer needs beyond the GenerateRequest."""

    stream: bool
    include_usage: bool
    timeout_s: float | None
    n: int = 1  # choices per prompt
    logprobs: int | None = None  # the response shows log-probabilities, this many top
    echo: bool = False  # completions: the prompt comes first in text and logprobs
    # completions: a batch of prompts (each a string or token ids); () = the request's own
    prompts: tuple = ()
    tools: bool = False  # chat: the output may hold tool calls (the response parses them)


# -- requests ----------------------------------------------------------------------------


def chat_request(body, model: str) -> tuple[generate_pb2.GenerateRequest, Options]:
    body = _object(body, CHAT_FIELDS)
    req, opts = _common(body, model)
    opts = replace(opts, tools=openai_tools.apply(body, req))
    top = body.get("top_logprobs")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad("`logprobs` must be a boolean (the chat API's; top_logprobs says how "
                  "many alternatives)", "logprobs")
    if top is not None:
        if not is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad(f"`top_logprobs` must be an integer in [0, {MAX_TOP_LOGPROBS}], got "
                      f"{top!r}", "top_logprobs")
        if not logprobs:
            raise bad("`top_logprobs` needs `logprobs: true`", "top_logprobs")
    if logprobs:
        req.logprobs = top or 0
        opts = replace(opts, logprobs=top or 0)
    if body.get("prediction") is not None:
        req.prediction = _prediction(body["prediction"])
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
    calls: set[str] = set()
    for i, m in enumerate(messages):
        req.messages.append(_message(m, i, calls))
    return req, opts


def completion_request(body, model: str) -> tuple[generate_pb2.GenerateRequest, Options]:
    body = _object(body, COMPLETION_FIELDS)
    req, opts = _common(body, model)
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise bad("`echo` must be a boolean", "echo")
    logprobs = body.get("logprobs")
    if logprobs is True:  # not OpenAI's type, but what some clients send: 1
        logprobs = 1
    if logprobs is False:
        logprobs = None
    if logprobs is not None:
        if not is_int(logprobs) or not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
            raise bad(f"`logprobs` must be an integer in [0, {MAX_COMPLETION_LOGPROBS}] "
                      f"(alternatives per token), got {logprobs!r}", "logprobs")
        req.logprobs = logprobs
        req.prompt_logprobs = echo
    opts = replace(opts, logprobs=logprobs, echo=echo)
    if body.get("best_of") not in (None, 1):
        raise bad("`best_of` must be 1: specdec returns one completion", "best_of",
                  "unsupported_parameter")
    if body.get("suffix"):
        raise bad("`suffix` is not supported", "suffix", "unsupported_parameter")
    # OpenAI's default: 16; 0 with echo scores (or returns) the prompt alone
    _max_tokens(req, body.get("max_tokens", 16), "max_tokens", least=0 if echo else 1)
    if req.max_new_tokens == 0 and echo:
        req.prompt_logprobs = True  # the one round that scores the prompt, nothing after
        req.logprobs = req.logprobs if req.HasField("logprobs") else 0
    prompt = body.get("prompt")
    batch = prompt if isinstance(prompt, list) and prompt and \
        all(isinstance(p, (str, list)) for p in prompt) else [prompt]
    if len(batch) * opts.n > MAX_PROMPTS:
        raise bad(f"`prompt` holds {len(batch)} prompts and n is {opts.n}: at most "
                  f"{MAX_PROMPTS} completions per request", "prompt")
    prompts = tuple(_prompt(p, "missing_required_parameter" if prompt is None
                            else "invalid_value") for p in batch)
    if len(prompts) == 1:
        set_prompt(req, prompts[0])
        return req, opts
    return req, replace(opts, prompts=prompts)


def expand(req: generate_pb2.GenerateRequest, opts: Options) -> list[generate_pb2.GenerateRequest]:
    """The request's generations, in choice order (OpenAI's: prompt by prompt, n each):
    choice j of a prompt draws from its own seed stream (the request's seed for j = 0)."""
    out = []
    for prompt in opts.prompts or (None,):
        for j in range(opts.n):
            sub = generate_pb2.GenerateRequest()
            sub.CopyFrom(req)
            if prompt is not None:
                set_prompt(sub, prompt)
            if j:
                sub.sampling.seed = derive_seed(req.sampling.seed, "choice", j)
            out.append(sub)
    return out


def set_prompt(req: generate_pb2.GenerateRequest, prompt: str | list[int]) -> None:
    """One prompt of a completions request (a string or token ids) into `req`."""
    if isinstance(prompt, str):
        req.prompt = prompt
    else:
        req.prompt_token_ids.extend(prompt)


def _prompt(prompt, code: str) -> str | list[int]:
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        beyond = [t for t in prompt if not 0 <= t <= INT32_MAX]
        if beyond:
            raise bad("`prompt` token ids must be in the model's vocabulary (ids >= 0, "
                      f"below its vocab size); got {beyond[:5]}", "prompt")
        return list(prompt)
    raise bad("`prompt` must be a non-empty string, a list of token ids, or a list of "
              "those (a batch)", "prompt", code)


def _object(body, allowed: set[str]) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    check_unicode(body)
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
    n = body.get("n")
    n = 1 if n is None else n
    if not is_int(n) or not 1 <= n <= MAX_N:
        raise bad(f"`n` must be an integer in [1, {MAX_N}], got {n!r}", "n")
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        penalties[name] = number(body, name, 0.0)
        if not -2.0 <= penalties[name] <= 2.0:
            raise bad(f"`{name}` must be in [-2, 2], got {penalties[name]}", name)
    repetition = number(body, "repetition_penalty", 1.0)
    if not 0.0 < repetition <= 2.0:
        raise bad(f"`repetition_penalty` must be in (0, 2] (1 = off), got {repetition}",
                  "repetition_penalty")
    min_p = number(body, "min_p", 0.0)
    if not 0.0 <= min_p <= 1.0:
        raise bad(f"`min_p` must be in [0, 1] (0 = off), got {min_p}", "min_p")
    temperature = number(body, "temperature", DEFAULT_TEMPERATURE)
    if not 0.0 <= temperature <= 2.0:
        raise bad(f"`temperature` must be in [0, 2], got {temperature}", "temperature")
    top_p = number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad(f"`top_p` must be in (0, 1], got {top_p}", "top_p")
    seed = body.get("seed")
    if seed is not None and not is_int(seed):
        raise bad("`seed` must be an integer", "seed")
    top_k = body.get("top_k", 0)
    if not is_int(top_k) or not 0 <= top_k <= INT32_MAX:
        raise bad("`top_k` must be an integer >= 0 (0 = off)", "top_k")
    req = generate_pb2.GenerateRequest(sampling=common_pb2.SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k,
        seed=(seed % 2**64) if seed is not None else secrets.randbits(63),
        repetition_penalty=0.0 if repetition == 1.0 else repetition, min_p=min_p,
        logit_bias=_logit_bias(body.get("logit_bias")), **penalties))
    ignore_eos = body.get("ignore_eos") or False
    if not isinstance(ignore_eos, bool):
        raise bad("`ignore_eos` must be a boolean", "ignore_eos")
    req.ignore_eos = ignore_eos
    min_tokens = body.get("min_tokens", 0)
    if not is_int(min_tokens) or not 0 <= min_tokens <= INT32_MAX:
        raise bad("`min_tokens` must be an integer >= 0 (0 = off)", "min_tokens")
    req.sampling.min_tokens = min_tokens
    grammar = grammar_of(body)  # structured outputs (coordinator.api.openai_structured)
    if grammar is not None:
        req.sampling.grammar.CopyFrom(wire.grammar_to_proto(grammar))
    k = body.get("num_draft_tokens")
    if k is not None:
        if not is_int(k) or abs(k) > INT32_MAX:
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
        timeout = number(body, "timeout", 0.0)
        if timeout <= 0:
            raise bad("`timeout` must be > 0 seconds", "timeout")
    return req, Options(stream, bool(stream_options.get("include_usage")), timeout, n)


def _prediction(prediction) -> str:
    """OpenAI's Predicted Outputs: {"type": "content", "content": a string or text
    parts}, as the text."""
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise bad('`prediction` must be {"type": "content", "content": ...}, the text the '
                  "answer is expected to resemble", "prediction")
    content = prediction.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise bad("`prediction.content` parts must be {\"type\": \"text\", \"text\": ...}",
                      "prediction")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad("`prediction.content` must be a string or a list of text parts",
                  "prediction")
    return content


def _logit_bias(bias) -> dict[int, float]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} (JSON keys are strings);
    whether an id is in the vocabulary is GenerationService's to check."""
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise bad("`logit_bias` must be an object mapping token ids to biases in "
                  "[-100, 100]", "logit_bias")
    out = {}
    for key in bias:
        if not (isinstance(key, str) and key.isdigit() and int(key) <= INT32_MAX):
            raise bad(f"`logit_bias` keys must be token ids (non-negative integers), got "
                      f"{key!r}", "logit_bias")
        value = number(bias, key, 0.0, "logit_bias")
        if not -100.0 <= value <= 100.0:
            raise bad(f"`logit_bias` values must be in [-100, 100], got {value} for "
                      f"token {key}", "logit_bias")
        out[int(key)] = value
    return out


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
            setattr(req.contrastive, name, number(cd, name, 0.0, f"contrastive.{name}"))
    formulation = cd.get("formulation", "obrien")
    if formulation not in FORMULATIONS:
        raise bad(f"`contrastive.formulation` must be one of {', '.join(FORMULATIONS)}, got "
                  f"{formulation!r}", "contrastive.formulation")
    req.contrastive.formulation = FORMULATIONS[formulation]


def _max_tokens(req: generate_pb2.GenerateRequest, value, param: str,
                least: int = 1) -> None:
    if value is None:
        return  # GenerationService's cap, bounded by the context left after the prompt
    if not is_int(value) or not least <= value <= INT32_MAX:
        raise bad(f"`{param}` must be an integer >= {least}"
                  + (" (0 only with echo)" if least == 1 and value == 0 else ""), param)
    req.max_new_tokens = value


def _message(m, i: int, calls: set[str]) -> generate_pb2.ChatMessage:
    """One chat turn; `calls`: the tool call ids of earlier assistant turns (grows)."""
    if not isinstance(m, dict):
        raise bad(f"messages[{i}] must be an object with role and content", f"messages[{i}]")
    role = m.get("role")
    if role == "tool":
        return openai_tools.tool_turn(m, i, calls)
    if role not in ROLES:
        raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)} or tool, got "
                  f"{role!r}", f"messages[{i}].role")
    tool_calls = openai_tools.assistant_calls(m, i) if role == "assistant" else []
    calls.update(c.id for c in tool_calls)
    content = m.get("content")
    if content is None and tool_calls:
        content = ""
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
    return generate_pb2.ChatMessage(role=ROLES[role], content=content, tool_calls=tool_calls)
