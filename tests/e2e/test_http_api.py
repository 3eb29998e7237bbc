"""The OpenAI-compatible HTTP API through Ray Serve's HTTP proxy, with raw HTTP (httpx):
status codes, error shape, SSE framing, usage, and that HTTP and gRPC give the same
result for the same request (one generation logic behind both)."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

import httpx
import pytest

from specdec.v1 import common_pb2, generate_pb2
from tests.e2e.conftest import sessions_released

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Tell me about speculative decoding."}]


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator[3], timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def model(http) -> str:
    return http.get("/v1/models").json()["data"][0]["id"]


def events(response) -> list:
    """The SSE data lines of a streamed response, parsed; "[DONE]" kept as is."""
    out = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_health_and_models(http, model):
    health = http.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["target_replicas"] == 1
    listing = http.get("/v1/models").json()
    assert listing["object"] == "list"
    (card,) = listing["data"]
    assert card["object"] == "model" and card["id"] == model
    assert card["specdec"]["target"] == "tiny-random"
    assert card["specdec"]["draft"] == "tiny-random-draft"


def test_chat_equals_grpc_generate(http, model, generator_stub):
    """Same request through HTTP and gRPC: same ids, text, kinds and finish reason."""
    for k in (0, 4):
        body = {"model": model, "messages": CHAT, "max_tokens": 24, "temperature": 0,
                "num_draft_tokens": k}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        grpc_resp = generator_stub.Generate(generate_pb2.GenerateRequest(
            messages=[generate_pb2.ChatMessage(**m) for m in CHAT], max_new_tokens=24,
            num_draft_tokens=k, sampling=common_pb2.SamplingParams(temperature=0)),
            timeout=60)
        assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
        (choice,) = out["choices"]
        assert choice["message"] == {"role": "assistant", "content": grpc_resp.text}
        assert out["specdec"]["token_ids"] == list(grpc_resp.token_ids)
        assert {"length": "length", "eos": "stop"}[grpc_resp.finish_reason] == \
            choice["finish_reason"]
        usage = out["usage"]
        assert usage["completion_tokens"] == len(grpc_resp.token_ids)
        assert usage["prompt_tokens"] == grpc_resp.stats.prompt_tokens
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        details = usage["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] == 0  # no prediction
        assert details["rejected_prediction_tokens"] == 0
        if k == 0:
            assert usage["specdec"]["drafted_tokens"] == 0
            assert set(out["specdec"]["kinds"]) == {"target"}
        else:
            assert usage["specdec"]["accepted_tokens"] > 0


def test_stream_sse_framing_and_usage(http, model):
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 20,
            "temperature": 0, "num_draft_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        got = events(r)
    assert got[-1] == "[DONE]"
    usage_chunk, chunks = got[-2], got[:-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 20
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in got[:-1]}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks] == \
        [None] * (len(chunks) - 1) + ["length"]
    for c in chunks:
        tok = c["specdec"]
        assert len(tok["token_ids"]) == len(tok["kinds"]) == len(tok["token_texts"])
        assert "".join(tok["token_texts"]) == c["choices"][0]["text"]
    unary = http.post("/v1/completions", json={**body, "stream": False,
                                                "stream_options": None}).json()
    assert "".join(c["choices"][0]["text"] for c in chunks) == unary["choices"][0]["text"]
    assert [t for c in chunks for t in c["specdec"]["token_ids"]] == \
        unary["specdec"]["token_ids"]


def test_chat_stream_starts_with_the_role(http, model):
    body = {"model": model, "messages": CHAT, "max_tokens": 8, "temperature": 0,
            "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        got = events(r)
    assert got[-1] == "[DONE]" and "usage" not in got[-2]
    assert got[0]["object"] == "chat.completion.chunk"
    assert got[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in got[1:-1])


BAD = [
    ({"n": 9}, 400, "n"),
    ({"n": 0}, 400, "n"),
    ({"logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ({"logit_bias": {"1": 200}}, 400, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, 400, "logit_bias"),  # beyond the vocabulary
    ({"logit_bias": {"token": 1}}, 400, "logit_bias"),
    ({"presence_penalty": -3}, 400, "presence_penalty"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, 400, "tools"),
    ({"model": "gpt-4o"}, 404, "model"),
    ({"model": None}, 400, "model"),
    ({"temperature": 3}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 10**6}, 400, None),  # the service's cap, named by its message
    ({"frequency_penalty": 2.5}, 400, "frequency_penalty"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].tool_call_id"),
    ({"messages": [{"role": "function", "content": "x"}]}, 400, "messages[0].role"),
    ({"num_draft_tokens": 99}, 400, None),
    ({"stop": [1, 2]}, 400, "stop"),
    ({"bogus": 1}, 400, "bogus"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options"),
]


@pytest.mark.parametrize(("change", "status", "param"), BAD)
def test_bad_requests_get_openai_errors(http, model, change, status, param):
    body = {"model": model, "messages": CHAT, "max_tokens": 8, **change}
    body = {k: v for k, v in body.items() if v is not None}
    for stream in (False, True):
        r = http.post("/v1/chat/completions", json={**body, "stream": stream}
                      if "stream_options" not in change else body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["message"] and (param is None or err["param"] == param), err
    # the service is still up
    assert http.get("/health").status_code == 200


def test_invalid_json_and_wrong_body(http):
    r = http.post("/v1/chat/completions", content=b"{not json",
                  headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_unknown_paths_and_methods_get_openai_errors(http):
    for method, path, status, code in (("GET", "/v1/nothing", 404, "not_found"),
                                       ("POST", "/v2/chat/completions", 404, "not_found"),
                                       ("GET", "/v1/chat/completions", 405,
                                        "method_not_allowed")):
        r = http.request(method, path)
        assert r.status_code == status, (method, path, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == code and error["type"] == "invalid_request_error"
        assert path in error["message"]


def test_timeout_gives_504(http, model):
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 2000,
            "temperature": 0, "num_draft_tokens": 0, "timeout": 0.3}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "timeout"


def test_disconnect_mid_stream_releases_sessions(coordinator, model):
    _, draft_engine, target_engine, base = coordinator
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 2000,
            "temperature": 0, "num_draft_tokens": 4, "stream": True}
    with httpx.Client(base_url=base, timeout=60) as client, \
            client.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert len(target_engine.model.store) >= 1
    # the connection is closed here, mid-generation
    assert sessions_released(draft_engine, target_engine), \
        (len(draft_engine.model.store), len(target_engine.model.store))


SAME_CHECKS = [  # (HTTP body change, the same GenerateRequest fields)
    ({"max_tokens": 10**6}, {"max_new_tokens": 10**6}),
    ({"num_draft_tokens": 99}, {"num_draft_tokens": 99}),
    ({"messages": [{"role": "user", "content": "x " * 3000}]},
     {"messages": [generate_pb2.ChatMessage(role="user", content="x " * 3000)]}),
    ({"stop": ["s"] * 17}, {"stop": ["s"] * 17}),
    ({"top_k": 10**12}, None),  # too large for the wire: refused before the service
]


@pytest.mark.parametrize(("change", "fields"), SAME_CHECKS)
def test_http_and_grpc_validate_alike(http, model, generator_stub, change, fields):
    """The service's own checks answer both APIs with the same message."""
    import grpc

    body = {"model": model, "messages": CHAT, "max_tokens": 8, "temperature": 0, **change}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    if fields is None:
        return
    base = {"messages": [generate_pb2.ChatMessage(**m) for m in CHAT], "max_new_tokens": 8}
    with pytest.raises(grpc.RpcError) as info:
        generator_stub.Generate(generate_pb2.GenerateRequest(**{**base, **fields}),
                                timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert r.json()["error"]["message"] == info.value.details()


def test_past_the_cap_429_and_resource_exhausted_while_health_answers(
        http, model, coordinator, generator_stub):
    """The fixture's coordinator admits 4 generations: a 5th gets 429 over HTTP and
    RESOURCE_EXHAUSTED over gRPC at once (Serve lets it reach the replica), and /health
    and /v1/models still answer; the held streams are unharmed."""
    import grpc

    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 2000,
            "temperature": 0, "num_draft_tokens": 0, "stream": True}
    with httpx.Client(base_url=coordinator[3], timeout=60) as client, ExitStack() as stack:
        held = [stack.enter_context(client.stream("POST", "/v1/completions", json=body))
                for _ in range(4)]
        lines = [r.iter_lines() for r in held]
        for r, it in zip(held, lines, strict=True):
            assert r.status_code == 200
            assert next(it).startswith("data: ")
        t0 = time.monotonic()
        over = http.post("/v1/completions", json={**body, "stream": False})
        assert over.status_code == 429, over.text
        assert over.json()["error"]["type"] == "rate_limit_error"
        assert "concurrency limit" in over.json()["error"]["message"]
        with pytest.raises(grpc.RpcError) as info:
            generator_stub.Generate(generate_pb2.GenerateRequest(
                prompt="x", max_new_tokens=4), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert http.get("/health").status_code == 200
        assert http.get("/v1/models").status_code == 200
        assert time.monotonic() - t0 < 10
        for it in lines:  # still streaming
            assert next(line for line in it if line).startswith("data: ")
