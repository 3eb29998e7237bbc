"""API keys through Ray Serve: gRPC metadata and the HTTP header, 401/UNAUTHENTICATED with
what to send, the per-key cap, and health and the demo page open without a key."""

from __future__ import annotations

import time

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.client import Client, SpecdecAPIError
from specdec.v1 import generate_pb2, generate_pb2_grpc
from tests.e2e.conftest import start_coordinator

pytestmark = pytest.mark.slow

KEY, OTHER = "k" * 20 + "-alice", "o" * 20 + "-bob"


@pytest.fixture(scope="module")
def secured(draft_server, target_server, tmp_path_factory):
    """A coordinator that needs a key (alice, bob; one generation at a time per key):
    (gRPC address, HTTP base URL)."""
    keys = tmp_path_factory.mktemp("auth") / "keys"
    keys.write_text(f"alice:{KEY}\nbob:{OTHER}\n")
    proc, _, http_port = start_coordinator([
        "--draft", draft_server[0], "--target", target_server[0], "--api-keys", str(keys),
        "--api-key-concurrency", "1"])
    yield proc.address, f"http://127.0.0.1:{http_port}"
    output = proc.output
    assert proc.stop() == 0, output[-3000:]
    assert KEY not in output and OTHER not in output  # keys never logged


def request(n: int = 8) -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(prompt="Hello", max_new_tokens=n, num_draft_tokens=4)


def test_grpc_needs_a_key(secured):
    with grpc.insecure_channel(secured[0]) as channel:
        stub = generate_pb2_grpc.GeneratorStub(channel)
        for metadata, fragment in ((None, "needs an API key"),
                                   ((("authorization", "Bearer wrong-key-000000"),),
                                    "not valid")):
            for call in (stub.Generate, lambda r, **kw: list(stub.GenerateStream(r, **kw))):
                with pytest.raises(grpc.RpcError) as info:
                    call(request(), timeout=30, metadata=metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert fragment in info.value.details()
                assert "'authorization: Bearer <key>' metadata" in info.value.details()
        ok = stub.Generate(request(), timeout=30,
                           metadata=(("authorization", f"Bearer {KEY}"),))
        assert len(ok.token_ids) == 8
        # health stays open
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_the_python_client_sends_the_key_as_metadata(secured):
    with Client(secured[0], timeout=30,
                metadata=(("authorization", f"Bearer {OTHER}"),)) as client:
        assert len(client.generate("Hello", max_new_tokens=6).token_ids) == 6
    with Client(secured[0], timeout=30) as client, pytest.raises(SpecdecAPIError) as info:
        client.generate("Hello", max_new_tokens=6)
    assert info.value.status_name == "UNAUTHENTICATED"


def test_http_needs_a_key_and_health_and_demo_do_not(secured):
    base = secured[1]
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/demo").status_code == 200
    r = httpx.get(base + "/v1/models")
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert "'authorization: Bearer <key>' header" in r.json()["error"]["message"]
    body = {"model": "tiny-random", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    for headers in ({}, {"Authorization": "Bearer nope-nope-nope-nope"}):
        r = httpx.post(base + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401, r.text
    ok = httpx.post(base + "/v1/completions", json=body,
                    headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200, ok.text


def test_openai_package_with_the_key_and_without(secured):
    good = openai.OpenAI(base_url=secured[1] + "/v1", api_key=KEY, max_retries=0)
    model = good.models.list().data[0].id
    out = good.completions.create(model=model, prompt="Hello", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4
    bad = openai.OpenAI(base_url=secured[1] + "/v1", api_key="not-a-key-at-all-0000",
                        max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.completions.create(model=model, prompt="Hello", max_tokens=4)
    assert info.value.status_code == 401


def test_per_key_cap_429_and_other_keys_unaffected(secured):
    base = secured[1]
    body = {"model": "tiny-random", "prompt": "Once upon a time", "max_tokens": 2000,
            "temperature": 0, "stream": True}
    alice = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base, timeout=60) as client, \
            client.stream("POST", "/v1/completions", json=body, headers=alice) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: dropping it would close the stream
        assert next(line for line in lines if line).startswith("data: ")
        short = {**body, "max_tokens": 4, "stream": False}
        over = client.post("/v1/completions", json=short, headers=alice)
        assert over.status_code == 429, over.text
        assert "'alice'" in over.json()["error"]["message"]
        with grpc.insecure_channel(secured[0]) as channel:  # the same key over gRPC
            with pytest.raises(grpc.RpcError) as info:
                generate_pb2_grpc.GeneratorStub(channel).Generate(
                    request(4), timeout=30, metadata=(("authorization", f"Bearer {KEY}"),))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        bob = client.post("/v1/completions", json=short,
                          headers={"Authorization": f"Bearer {OTHER}"})
        assert bob.status_code == 200, bob.text
    # alice's stream ended (disconnected): her slot is free again within moments
    deadline = time.monotonic() + 5
    while (again := httpx.post(base + "/v1/completions", json=short, headers=alice)
           ).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert again.status_code == 200, again.text


def test_demo_page_asks_for_the_key_and_works_with_it(secured):
    """Without a key the page shows the 401's message; typing the key loads the model and
    a generation streams."""
    from selenium.webdriver.common.keys import Keys

    from specdec_tools.bench import browser

    why = browser.missing()
    if why:
        pytest.fail(f"the browser test needs Chromium: {why}", pytrace=False)
    with browser.chromium(1200, 900) as driver:
        driver.get(secured[1] + "/demo")
        assert browser.wait_state(driver, ("idle", "error"), 30) == "error"
        assert "needs an API key" in browser.text(driver, "error")
        browser.fill(driver, "api-key", KEY)
        driver.find_element("id", "api-key").send_keys(Keys.TAB)  # a change event
        browser.wait_state(driver, ("idle",), 30)  # loading, then the model card
        assert browser.text(driver, "error") == ""
        final = browser.generate(driver, prompt="Hello", k=4, max_tokens=8, compare=False)
        assert final == "done", browser.text(driver, "error")
        assert len(browser.kinds(driver, "spec")) == 8
