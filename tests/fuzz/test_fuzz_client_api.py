"""Fuzzing the coordinator's client API: GenerationService directly (broad and cheap: the
validation and generation logic behind both gRPC Generate and HTTP), then the OpenAI
HTTP API on a real uvicorn server (tests/http_frontend.py) with JSON of every type in
every field, lone surrogates, numbers beyond a double, token ids beyond 32 bits, bodies
that are not JSON or not UTF-8, nested too deeply, or larger than the body limit.

A generation either succeeds with a consistent result (ids in the vocabulary, one kind
and one text per token, the texts joined equal to the text, the finish reason and the
stop strings respected, greedy output equal to target-only decoding) or fails with a
client error (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...; on HTTP a 4xx in OpenAI's error
shape {"error": {"message", "type", "param", "code"}}); never INTERNAL or a 500. After
each test, normal requests give exactly their recorded answers and no session is left.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from coordinator.api.service import CHAT_ROLES, MAX_STOP_CHARS, MAX_STOP_STRINGS
from specdec.errors import SpecdecError
from specdec.v1 import common_pb2, generate_pb2
from tests.fuzz._fuzz_stack import PROMPT, VOCAB, examples

INT32 = st.integers(-2**31, 2**31 - 1)
UINT64 = st.integers(0, 2**64 - 1)
SERVICE_ERRORS = {"INVALID_ARGUMENT", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED",
                  "FAILED_PRECONDITION"}
FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e-45, 3.4e38,
                     1.5, 2.0]),
    st.floats(allow_nan=True, allow_infinity=True, width=32))
TEXT = st.text(max_size=60)
SPECIALS = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "\x00", "\ufffd",
                            "🙂", "é", "\u200b", "\r\n"])
PROMPT_TEXT = st.one_of(st.text(min_size=1, max_size=60),
                        st.lists(st.one_of(SPECIALS, TEXT), min_size=1, max_size=5).map(
                            "".join).filter(bool))


@pytest.fixture()
def fuzz_api(stack):
    """The stack, checked healthy (exact answers everywhere, no session) after the test."""
    yield stack
    stack.assert_healthy()


# -- GenerationService --------------------------------------------------------------------

VALID = {
    "prompt": PROMPT_TEXT,
    "messages": st.lists(st.builds(generate_pb2.ChatMessage, role=st.sampled_from(CHAT_ROLES),
                                   content=TEXT), min_size=1, max_size=3),
    "prompt_token_ids": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=16),
    "max_new_tokens": st.integers(1, 8),
    "sampling": st.one_of(st.just(common_pb2.SamplingParams()),
                          st.builds(common_pb2.SamplingParams,
                                    temperature=st.floats(0.0625, 2.0, width=32),
                                    top_k=st.integers(0, 100),
                                    top_p=st.floats(0.0, 1.0, width=32), seed=UINT64)),
    "num_draft_tokens": st.one_of(st.none(), st.integers(0, 6)),
    "stop": st.lists(st.text(min_size=0, max_size=4), max_size=3),
}
WILD = {
    "prompt": st.one_of(st.just(""), st.just("x " * 3000), PROMPT_TEXT),
    "messages": st.lists(st.builds(generate_pb2.ChatMessage,
                                   role=st.one_of(st.sampled_from(["", "tool", "USER", "a" * 300]),
                                                  TEXT), content=TEXT), max_size=4),
    "prompt_token_ids": st.one_of(st.lists(INT32, max_size=8),
                                  st.sampled_from([[], [VOCAB], [-1], [2**31 - 1], [-2**31],
                                                   [0] * 2047, [0] * 2048, [1] * 5000])),
    # never a valid count above 8: a fuzz example is a real generation
    "max_new_tokens": st.one_of(st.sampled_from([0, -1, 4097, 2**31 - 1, -2**31]),
                                st.integers(-2**31, 0), st.integers(min_value=4097,
                                                                      max_value=2**31 - 1)),
    "sampling": st.builds(common_pb2.SamplingParams, temperature=FLOATS, top_k=INT32,
                          top_p=FLOATS, seed=UINT64),
    "num_draft_tokens": st.one_of(st.sampled_from([-1, 16, 17, 2**31 - 1, -2**31]), INT32),
    "stop": st.one_of(st.lists(st.text(max_size=3), min_size=MAX_STOP_STRINGS + 1,
                               max_size=MAX_STOP_STRINGS + 3),
                      st.just(["x" * (MAX_STOP_CHARS + 1)]), st.just([""] * 4),
                      st.lists(SPECIALS, max_size=3)),
}
PROMPT_KINDS = ("prompt", "messages", "prompt_token_ids")


@st.composite
def generate_requests(draw):
    """Mostly one prompt kind and valid fields with up to three mutated; sometimes no or
    several prompt kinds, sometimes everything wild."""
    kinds = [draw(st.sampled_from(PROMPT_KINDS))]
    if draw(st.integers(0, 9)) == 0:
        kinds = draw(st.lists(st.sampled_from(PROMPT_KINDS), unique=True, max_size=3))
    names = [*kinds, "max_new_tokens", "sampling", "num_draft_tokens", "stop"]
    mutated = set(names) if draw(st.integers(0, 7)) == 0 else \
        draw(st.sets(st.sampled_from(names), max_size=3))
    values = {n: draw(WILD[n] if n in mutated else VALID[n]) for n in names}
    if values["num_draft_tokens"] is None:
        del values["num_draft_tokens"]
    return generate_pb2.GenerateRequest(**values)


def check_response(stack, req: generate_pb2.GenerateRequest,
                   resp: generate_pb2.GenerateResponse) -> None:
    n = len(resp.token_ids)
    assert resp.finish_reason in ("length", "eos", "stop")
    assert 1 <= n <= req.max_new_tokens or (n == 0 and resp.finish_reason == "stop")
    assert len(resp.kinds) == len(resp.token_texts) == n
    assert "".join(resp.token_texts) == resp.text
    assert all(0 <= t < VOCAB for t in resp.token_ids)
    assert all(generate_pb2.TOKEN_KIND_ACCEPTED <= k <= generate_pb2.TOKEN_KIND_TARGET
               for k in resp.kinds)
    assert resp.stats.generated_tokens == n
    if resp.finish_reason == "length":
        assert n == min(req.max_new_tokens, stack.service.limits.max_context -
                        resp.stats.prompt_tokens)
    for s in req.stop:
        if s:
            assert s not in resp.text, (s, resp.text)


@examples(60)
@given(req=generate_requests())
@example(req=generate_pb2.GenerateRequest(prompt_token_ids=[0] * 2047, max_new_tokens=8,
                                          num_draft_tokens=6))
@example(req=generate_pb2.GenerateRequest(prompt="<|im_end|>\ufffd", max_new_tokens=3,
                                          stop=["", "\ufffd"], sampling=common_pb2.SamplingParams(
                                              temperature=1e-45, top_p=1e-45, top_k=1)))
def test_generation_service_fuzz(fuzz_api, req):
    stack = fuzz_api
    try:
        resp = stack.service.generate(req)
    except SpecdecError as exc:
        assert exc.code in SERVICE_ERRORS, (exc.code, exc.message)
        assert exc.message
        event(exc.code)
        return
    event("OK")
    check_response(stack, req, resp)
    if req.sampling.temperature == 0 and not req.stop and \
            (not req.HasField("num_draft_tokens") or req.num_draft_tokens > 0):
        # Greedy speculative decoding is lossless: target-only decoding gives the same.
        alone = generate_pb2.GenerateRequest()
        alone.CopyFrom(req)
        alone.num_draft_tokens = 0
        assert list(stack.service.generate(alone).token_ids) == list(resp.token_ids)


def test_generation_service_stream_closed_early_frees_its_sessions(fuzz_api):
    """A stream its client abandons after the first chunk: the sessions are freed."""
    stack = fuzz_api
    chunks = stack.service.stream(generate_pb2.GenerateRequest(
        prompt="hello", max_new_tokens=8, num_draft_tokens=2))
    next(chunks)
    chunks.close()
    stack.assert_no_sessions()


# -- HTTP: JSON of any shape ---------------------------------------------------------------

SURROGATES = st.characters(categories=["Cs"])
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), INT32, st.sampled_from([2**31, 2**63, 2**64, 10**30]),
    st.sampled_from([1, -1]).map(lambda sign: sign * 10**400),  # beyond a double
    st.floats(allow_nan=True, allow_infinity=True), TEXT,
    st.text(st.one_of(SURROGATES, st.characters()), min_size=1, max_size=4))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=8)
PARAMS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens",
          "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n",
          "user", "num_draft_tokens", "timeout", "logprobs", "presence_penalty",
          "frequency_penalty", "logit_bias", "echo", "best_of", "suffix", "tools",
          "tool_choice", "response_format", "top_logprobs", "prediction", "frobnicate"]


@st.composite
def http_bodies(draw, model: str):
    """(path, body): a valid chat or completion body with up to four parameters set to
    JSON of any type (or removed), or something that is no object at all."""
    chat = draw(st.booleans())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if draw(st.integers(0, 11)) == 0:
        return path, draw(JSON_VALUES)
    body = {"model": model, "max_tokens": draw(st.integers(1, 6)),
            "temperature": draw(st.sampled_from([0, 0.7, 1])),
            "num_draft_tokens": draw(st.integers(0, 4)), "stream": draw(st.booleans())}
    if chat:
        body["messages"] = [{"role": draw(st.sampled_from(["user", "system", "developer"])),
                             "content": draw(TEXT)}]
    else:
        body["prompt"] = draw(st.one_of(PROMPT_TEXT, st.lists(st.integers(0, VOCAB - 1),
                                                              min_size=1, max_size=8)))
    for name in draw(st.lists(st.sampled_from(PARAMS), max_size=4, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            body.pop(name, None)
        else:
            body[name] = draw(JSON_VALUES)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 4  # no limit would generate to the end of the context
    return path, body


def check_error_body(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    assert err["type"] != "server_error", err
    return err


def check_http(r: httpx.Response, body) -> None:
    timeout_given = isinstance(body, dict) and body.get("timeout") is not None
    assert r.status_code < 500 or (r.status_code == 504 and timeout_given), \
        (r.status_code, r.text[:500])
    event(str(r.status_code))
    if r.status_code >= 400:
        check_error_body(r)
        return
    assert r.status_code == 200
    if r.headers["content-type"].startswith("text/event-stream"):
        lines = [ln for ln in r.text.split("\n") if ln]
        assert lines and lines[-1] == "data: [DONE]", r.text[-300:]
        for line in lines[:-1]:
            assert line.startswith("data: ")
            event_ = json.loads(line[len("data: "):])
            if "error" in event_:
                err = event_["error"]
                assert set(err) == {"message", "type", "param", "code"}, err
                assert err["type"] != "server_error", err
                assert err["code"] == "deadline_exceeded" and timeout_given, err
        return
    out = r.json()
    (choice,) = out["choices"]
    assert choice["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] == len(out["specdec"]["token_ids"])


@pytest.fixture(scope="module")
def http(stack):
    with httpx.Client(base_url=stack.http_url, timeout=60) as client:
        yield client


@examples(70)
@given(data=st.data())
def test_http_json_fuzz(fuzz_api, http, data):
    path, body = data.draw(http_bodies(fuzz_api.service.card.id))
    # json.dumps writes NaN and Infinity (Python's json.loads reads them) and escapes
    # lone surrogates as \udXXX: both reach the server as they would from any client.
    r = http.post(path, content=json.dumps(body).encode(),
                  headers={"content-type": "application/json"})
    check_http(r, body)


# -- HTTP: bodies that are not JSON, not UTF-8, too deep, too large ------------------------

VALID_BODY = b'{"model": "tiny-random", "prompt": "hello", "max_tokens": 3, "temperature": 0}'


@examples(40)
@given(raw=st.one_of(
    st.binary(max_size=300),
    st.integers(0, len(VALID_BODY) - 1).map(lambda i: VALID_BODY[:i]),  # truncated
    st.tuples(st.integers(0, len(VALID_BODY) - 1),
              st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\xc0\xaf"]))
    .map(lambda t: VALID_BODY[:t[0]] + t[1] + VALID_BODY[t[0]:])),  # not UTF-8
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    content_type=st.sampled_from(["application/json", "text/plain", "", "application/x-www"
                                  "-form-urlencoded; charset=latin-1"]))
@example(raw=b'"\\ud800"', path="/v1/completions", content_type="application/json")
@example(raw=b"[" * 100_000, path="/v1/completions", content_type="application/json")
@example(raw=b'{"a":' * 50_000, path="/v1/chat/completions", content_type="application/json")
def test_http_raw_body_fuzz(fuzz_api, http, raw, path, content_type):
    r = http.post(path, content=raw, headers={"content-type": content_type})
    check_http(r, None)


# -- regressions: each was a 500 before its fix --------------------------------------------


def _post(http, path, raw: bytes) -> httpx.Response:
    return http.post(path, content=raw, headers={"content-type": "application/json"})


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"x":' * 10_000 + b"1" + b"}" * 10_000],
                         ids=["array", "object"])
def test_json_nested_too_deeply_is_400(fuzz_api, http, raw):
    """RecursionError from json.loads was a 500."""
    r = _post(http, "/v1/completions", raw)
    assert r.status_code == 400, r.text
    assert "nests arrays or objects too deeply" in check_error_body(r)["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "\ud800", "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": ["\udfff"], "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stop": ["\ud800"], "max_tokens": 2}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udc00x"}],
                              "max_tokens": 2}, "messages"),
    ("/v1/completions", {"prompt": "hi", "temperature": 10**400, "max_tokens": 2},
     "temperature"),
    ("/v1/completions", {"prompt": "hi", "timeout": 10**400, "max_tokens": 2}, "timeout"),
    ("/v1/completions", {"prompt": [10**30], "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": [[2**31]], "max_tokens": 2}, "prompt"),
])
def test_hostile_values_are_400(fuzz_api, http, path, body, param):
    """UnicodeEncodeError (lone surrogates), OverflowError (an integer beyond a double)
    and protobuf's ValueError (a token id beyond 32 bits) were 500s."""
    body = {"model": fuzz_api.service.card.id, **body}
    r = _post(http, path, json.dumps(body).encode())
    assert r.status_code == 400, r.text
    assert check_error_body(r)["param"] == param


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "hi", "stop": ["a"] * (MAX_STOP_STRINGS + 1)}, "stop"),
    ({"prompt": [VOCAB]}, "prompt"),
])
def test_service_errors_name_the_parameter(fuzz_api, http, body, param):
    """GenerationService's refusals name the OpenAI parameter they came from."""
    body = {"model": fuzz_api.service.card.id, "max_tokens": 2, **body}
    r = _post(http, "/v1/completions", json.dumps(body).encode())
    assert r.status_code == 400, r.text
    assert check_error_body(r)["param"] == param


def test_body_beyond_the_limit_is_413(fuzz_api, http):
    """A body past MAX_BODY_BYTES is refused before it is read whole, whether it says its
    length or comes chunked; one just under it is parsed (and refused for its content)."""
    from coordinator.api.http_api import MAX_BODY_BYTES

    model = fuzz_api.service.card.id
    big = json.dumps({"model": model, "prompt": "x" * (MAX_BODY_BYTES + 10),
                      "max_tokens": 2}).encode()
    r = _post(http, "/v1/completions", big)
    assert r.status_code == 413, r.text[:300]
    assert check_error_body(r)["code"] == "request_too_large"

    def chunks():
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + (1 << 20)]

    r = http.post("/v1/completions", content=chunks(),
                  headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:300]
    # just under the limit: read and parsed (an ignored `user` makes up the size)
    under = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 12,
                        "temperature": 0, "num_draft_tokens": 4, "user": ""}).encode()
    under = under.replace(b'"user": ""', b'"user": "' + b"u" * (MAX_BODY_BYTES - len(under))
                          + b'"')
    assert len(under) == MAX_BODY_BYTES
    r = _post(http, "/v1/completions", under)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["text"] == fuzz_api.ref.http_text


@pytest.mark.slow
@pytest.mark.parametrize(("path", "body", "fragment"), [
    ("/v1/completions", {"prompt": [1] * 1_000_000}, "context"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 100_000},
     "context"),
    ("/v1/completions", {"prompt": "hi", "stop": ["x"] * 100_000}, "at most"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {str(i): 1 for i in range(100_000)}},
     "logit_bias"),
], ids=["token-ids", "messages", "stop", "logit-bias"])
def test_huge_repeated_fields_over_http(fuzz_api, http, path, body, fragment):
    """Megabytes of repeated values under the body limit: each refused with a 400 that
    says why, within seconds."""
    body = {"model": fuzz_api.service.card.id, "max_tokens": 2, **body}
    r = _post(http, path, json.dumps(body).encode())
    assert r.status_code == 400, r.text[:300]
    assert fragment in check_error_body(r)["message"]
