"""The browser demo over HTTPS: a coordinator with TLS on its client API (no client
certificates asked), the page loaded in headless Chromium through the TLS terminator,
and its greedy answer equal to the API's over HTTPS. Needs `make browser` (fails, never
skips, without it)."""

from __future__ import annotations

import ssl

import httpx
import pytest

from specdec import certs
from specdec_tools.bench import browser
from tests.e2e.conftest import start_coordinator

pytestmark = pytest.mark.slow

PROMPT = "Tell me about speculative decoding."


@pytest.fixture(scope="module")
def https(draft_server, target_server, tmp_path_factory):
    """(HTTPS base URL, CA path) of a coordinator whose client API is TLS."""
    pki = certs.make_dev_certs(tmp_path_factory.mktemp("pki"), ["127.0.0.1"], days=2,
                               roles=("coordinator",))
    proc, _, http_port = start_coordinator([
        "--draft", draft_server[0], "--target", target_server[0], "--max-concurrency", "4",
        "--api-tls-cert", str(pki["coordinator"][0]),
        "--api-tls-key", str(pki["coordinator"][1])])
    yield f"https://127.0.0.1:{http_port}", str(pki["ca"][0])
    assert proc.stop() == 0, proc.output[-3000:]


def test_demo_page_over_https(https):
    base, ca = https
    why = browser.missing()
    if why:
        pytest.fail(f"the browser test needs Chromium: {why}", pytrace=False)
    with browser.chromium(1200, 900, accept_insecure_certs=True) as driver:
        browser.open_demo(driver, base)
        state = browser.generate(driver, prompt=PROMPT, k=4, temperature=0, max_tokens=16,
                                 seed=7, compare=False, timeout=90)
        assert state == "done", browser.text(driver, "error")
        page_text = browser.text(driver, "answer-spec")
        assert driver.current_url.startswith("https://")
    with httpx.Client(base_url=base, verify=ssl.create_default_context(cafile=ca),
                      timeout=60) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        api = http.post("/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 16, "temperature": 0, "num_draft_tokens": 4, "seed": 7})
        assert api.status_code == 200, api.text
    assert page_text == api.json()["choices"][0]["message"]["content"] != ""
