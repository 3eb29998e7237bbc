"""The coordinator's browser demo (GET /demo, coordinator/demo.html) in a real headless
Chromium over the real coordinator and tiny-model services: it streams a speculative
answer and a target-only one, colours tokens by kind, shows speeds, and its greedy text is
the API's; an API error is shown on the page; in JSON-schema mode the answer is JSON valid
against the page's schema, and a schema that is not JSON is refused before anything is
sent. Needs `make browser`; without the browser these tests fail (never skip)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import jsonschema
import pytest

from specdec_tools.bench import browser

pytestmark = pytest.mark.slow

SHOTS = Path(__file__).resolve().parents[2] / "bench-results" / "demo"
PROMPT = "Tell me about speculative decoding."
TIMEOUT_S = 90
JSON_PROMPT = "Describe the weather as JSON."
# Enums, a boolean and a small integer range: bounded, so even a random model completes it.
WEATHER = {"type": "object",
           "properties": {"sunny": {"type": "boolean"},
                          "wind": {"enum": ["calm", "breeze", "storm"]},
                          "level": {"type": "integer", "minimum": 1, "maximum": 5}},
           "required": ["sunny", "wind", "level"], "additionalProperties": False}


@contextmanager
def chromium():
    """The headless browser, or a test failure naming `make browser`."""
    why = browser.missing()
    if why:
        pytest.fail(f"the browser test needs Chromium: {why}", pytrace=False)
    with browser.chromium(1400, 1000) as driver:
        yield driver


@pytest.fixture(scope="module")
def card(coordinator) -> dict:
    return httpx.get(f"{coordinator[3]}/v1/models", timeout=30).json()["data"][0]


def chat(base: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)


def json_mode(driver, on: bool = True) -> None:
    """Pick the page's output mode: JSON schema, or free text."""
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", "output")).select_by_value("json_schema" if on else "text")


def record_posts(driver) -> None:
    """From now on the page's fetch() calls to the chat API are listed in window.posts."""
    driver.execute_script(
        "window.posts = []; const f = window.fetch;"
        "window.fetch = (url, init) => {"
        "  if (String(url).includes('/chat/completions')) window.posts.push(init.body);"
        "  return f(url, init); };")


def test_demo_streams_kinds_and_compares_with_target_only(coordinator, card):
    base = coordinator[3]
    with chromium() as driver:
        browser.open_demo(driver, base)
        assert driver.find_element("id", "k").get_attribute("value") == \
            str(card["specdec"]["default_num_draft_tokens"])
        state = browser.generate(driver, prompt=PROMPT, k=4, temperature=0, max_tokens=32,
                                 seed=1234, compare=True, timeout=TIMEOUT_S)
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / "demo-tiny.png"))
        assert state == "done", browser.text(driver, "error")
        spec_kinds, target_kinds = browser.kinds(driver, "spec"), browser.kinds(driver, "target")
        spec_text = browser.text(driver, "answer-spec")
        target_text = browser.text(driver, "answer-target")
        spec_stats, target_stats = browser.stats(driver, "spec"), browser.stats(driver, "target")
        speedup = browser.text(driver, "speedup")
        assert browser.text(driver, "error") == ""
        assert driver.find_element("id", "generate").is_enabled()
        assert not driver.find_element("id", "stop").is_enabled()

    # every token a span of a known kind; speculation visible in the speculative pane,
    # whose first token is the target's own (from the prompt's pass, before any draft);
    # later target tokens are rounds whose pre-draft assumed another outcome
    assert spec_kinds[0] == "target", spec_kinds
    assert "accepted" in spec_kinds, spec_kinds
    assert {"recovered", "bonus"} & set(spec_kinds), spec_kinds
    assert set(spec_kinds) <= {"accepted", "recovered", "bonus", "target"}, spec_kinds
    assert target_kinds and set(target_kinds) == {"target"}, target_kinds
    assert len(spec_kinds) == len(target_kinds) == 32

    # the page's text is the API's for the same request, and greedy = target only
    api = chat(base, {"model": card["id"], "messages": [{"role": "user", "content": PROMPT}],
                      "max_tokens": 32, "temperature": 0, "num_draft_tokens": 4,
                      "seed": 1234})
    assert api.status_code == 200, api.text
    assert spec_text == api.json()["choices"][0]["message"]["content"]
    assert spec_text == target_text

    # stats: numbers from the stream and the final usage
    for shown in (spec_stats, target_stats):
        assert float(shown["tps"]) > 0, shown
        assert float(shown["ttft"]) > 0, shown
        assert shown["tokens"] == "32", shown
    assert float(spec_stats["per-pass"]) > 1.0, spec_stats  # accepted tokens > 0
    assert 0 < float(spec_stats["acceptance"]) <= 1, spec_stats
    assert float(target_stats["per-pass"]) == 1.0, target_stats
    assert speedup.startswith("speedup ") and float(speedup.split()[1].rstrip("x")) > 0, speedup


def test_demo_shows_the_api_error(coordinator, card):
    base = coordinator[3]
    body = {"model": card["id"], "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 8, "temperature": 0, "seed": 1234, "num_draft_tokens": 999,
            "stream": True, "stream_options": {"include_usage": True}}
    expected = chat(base, body)
    assert expected.status_code == 400, expected.text
    message = expected.json()["error"]["message"]
    with chromium() as driver:
        browser.open_demo(driver, base)
        state = browser.generate(driver, prompt=PROMPT, k=999, max_tokens=8, compare=True,
                                 timeout=TIMEOUT_S)
        assert state == "error"
        shown = browser.text(driver, "error")
        assert message in shown and shown.startswith("speculative request failed"), shown
        assert driver.find_element("id", "error").is_displayed()
        assert browser.kinds(driver, "target") == []  # the comparison did not run
        assert driver.find_element("id", "generate").is_enabled()
        # the page recovers: the next (valid) run is done and clears the error
        assert browser.generate(driver, prompt=PROMPT, k=2, max_tokens=4, compare=False,
                                timeout=TIMEOUT_S) == "done"
        assert browser.text(driver, "error") == ""
        assert len(browser.kinds(driver, "spec")) == 4


def test_demo_stop_aborts_and_the_server_releases_the_sessions(coordinator):
    _, draft_engine, target_engine, base = coordinator
    with chromium() as driver:
        browser.open_demo(driver, base)
        browser.fill(driver, "prompt", PROMPT)
        browser.fill(driver, "k", 4)
        browser.fill(driver, "max-tokens", 2000)
        if driver.find_element("id", "compare").is_selected():
            driver.find_element("id", "compare").click()
        driver.find_element("id", "generate").click()
        deadline = time.monotonic() + TIMEOUT_S
        while len(browser.kinds(driver, "spec")) < 8:  # streaming has begun
            assert browser.state(driver) == "running", browser.text(driver, "error")
            assert time.monotonic() < deadline, "no tokens streamed"
            time.sleep(0.05)
        assert not driver.find_element("id", "generate").is_enabled()
        assert len(target_engine.model.store) >= 1
        driver.find_element("id", "stop").click()
        assert browser.wait_state(driver, browser.FINAL_STATES, 10) == "stopped"
        shown = len(browser.kinds(driver, "spec"))
        assert 8 <= shown < 2000
        assert driver.find_element("id", "generate").is_enabled()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (len(draft_engine.model.store) or
                                            len(target_engine.model.store)):
        time.sleep(0.1)
    assert len(draft_engine.model.store) == 0
    assert len(target_engine.model.store) == 0


def test_demo_json_schema_mode_streams_json_valid_against_the_schema(coordinator, card):
    base = coordinator[3]
    with chromium() as driver:
        browser.open_demo(driver, base)
        assert not driver.find_element("id", "schema").is_displayed()  # free text first
        json_mode(driver)
        assert driver.find_element("id", "schema").is_displayed()
        example = json.loads(driver.find_element("id", "schema").get_attribute("value"))
        assert driver.find_element("id", "prompt").get_attribute("value").startswith(
            "Review speculative decoding as JSON")
        max_tokens = int(driver.find_element("id", "max-tokens").get_attribute("value"))
        browser.fill(driver, "schema", json.dumps(WEATHER))
        record_posts(driver)
        state = browser.generate(driver, prompt=JSON_PROMPT, k=4, temperature=0,
                                 max_tokens=max_tokens, seed=1234, compare=True,
                                 timeout=TIMEOUT_S)
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / "demo-json-schema.png"))
        assert state == "done", browser.text(driver, "error")
        schema = json.loads(driver.find_element("id", "schema").get_attribute("value"))
        texts = {p: browser.text(driver, f"answer-{p}") for p in ("spec", "target")}
        checks = {p: browser.text(driver, f"json-{p}") for p in ("spec", "target")}
        posts = [json.loads(b) for b in driver.execute_script("return window.posts")]
        assert driver.find_element("id", "json-spec").is_displayed()

    assert schema == WEATHER
    assert [b["response_format"] for b in posts] == [{
        "type": "json_schema", "json_schema": {"name": "demo", "schema": WEATHER,
                                               "strict": True}}] * 2
    assert [b["num_draft_tokens"] for b in posts] == [4, 0]
    for pane, text in texts.items():
        assert checks[pane].startswith("output parses as JSON"), (pane, checks[pane], text)
        jsonschema.validate(json.loads(text), schema)
    assert texts["spec"] == texts["target"]  # greedy: constrained speculation = target only
    api = chat(base, {"model": card["id"], "messages": [{"role": "user", "content": JSON_PROMPT}],
                      "max_tokens": max_tokens, "temperature": 0, "num_draft_tokens": 4,
                      "seed": 1234, "response_format": posts[0]["response_format"]})
    assert api.status_code == 200, api.text
    assert texts["spec"] == api.json()["choices"][0]["message"]["content"]

    # the page's own example schema is a schema, and one the server takes
    jsonschema.Draft202012Validator.check_schema(example)
    taken = chat(base, {"model": card["id"], "messages": [{"role": "user", "content": "Hi"}],
                        "max_tokens": 1, "response_format": {
                            "type": "json_schema",
                            "json_schema": {"name": "demo", "schema": example, "strict": True}}})
    assert taken.status_code == 200, taken.text


def test_demo_json_schema_mode_refuses_a_bad_schema(coordinator, card):
    base = coordinator[3]
    rejected = {"type": 5}
    expected = chat(base, {"model": card["id"], "messages": [{"role": "user", "content": PROMPT}],
                           "max_tokens": 8, "response_format": {
                               "type": "json_schema", "json_schema": {
                                   "name": "demo", "schema": rejected, "strict": True}}})
    assert expected.status_code == 400, expected.text
    message = expected.json()["error"]["message"]
    with chromium() as driver:
        browser.open_demo(driver, base)
        json_mode(driver)
        record_posts(driver)
        # not JSON: the page says so and sends nothing
        browser.fill(driver, "schema", '{"type": "object",')
        state = browser.generate(driver, prompt=JSON_PROMPT, k=2, max_tokens=8, compare=True,
                                 timeout=TIMEOUT_S)
        assert state == "error"
        shown = browser.text(driver, "error")
        assert shown.startswith("the JSON schema is not valid JSON, nothing was sent"), shown
        assert driver.find_element("id", "error").is_displayed()
        assert driver.execute_script("return window.posts") == []
        assert browser.kinds(driver, "spec") == []
        assert driver.find_element("id", "generate").is_enabled()

        # JSON, but not a schema the server can compile: its 400 message is shown
        browser.fill(driver, "schema", json.dumps(rejected))
        state = browser.generate(driver, prompt=JSON_PROMPT, k=2, max_tokens=8, compare=True,
                                 timeout=TIMEOUT_S)
        assert state == "error"
        shown = browser.text(driver, "error")
        assert message in shown and shown.startswith("speculative request failed"), shown
        assert len(driver.execute_script("return window.posts")) == 1  # no comparison run
        assert not driver.find_element("id", "json-spec").is_displayed()

        # back to free text: as before, no response_format and no JSON line
        json_mode(driver, False)
        assert not driver.find_element("id", "schema").is_displayed()
        assert browser.generate(driver, prompt=PROMPT, k=2, max_tokens=4, compare=False,
                                timeout=TIMEOUT_S) == "done"
        assert browser.text(driver, "error") == ""
        assert len(browser.kinds(driver, "spec")) == 4
        assert not driver.find_element("id", "json-spec").is_displayed()
        last = json.loads(driver.execute_script("return window.posts")[-1])
        assert "response_format" not in last


def test_demo_tools_mode_shows_the_call_its_result_and_the_answer(coordinator, card):
    """Tools mode: the page sends its sample tool; with tool_choice required the model
    calls it (arguments by the schema), the page runs it, shows call and result, and
    streams the answer to the result; the speculative and target-only calls agree."""
    from selenium.webdriver.support.ui import Select

    with chromium() as driver:
        browser.open_demo(driver, coordinator[3])
        Select(driver.find_element("id", "output")).select_by_value("tools")
        assert driver.find_element("id", "tool-choice").is_displayed()
        assert driver.find_element("id", "prompt").get_attribute("value").startswith(
            "What is the weather")
        Select(driver.find_element("id", "tool-choice")).select_by_value("required")
        record_posts(driver)
        state = browser.generate(driver, prompt="Weather in Lisbon?", k=4, temperature=0,
                                 max_tokens=96, seed=1, compare=True, timeout=TIMEOUT_S)
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / "demo-tools.png"))
        assert state == "done", browser.text(driver, "error")
        calls = {p: browser.text(driver, f"calls-{p}") for p in ("spec", "target")}
        finals = {p: driver.find_element("id", f"final-{p}").is_displayed()
                  for p in ("spec", "target")}
        posts = [json.loads(b) for b in driver.execute_script("return window.posts")]

    assert [p["tool_choice"] for p in posts] == ["required", "none", "required", "none"]
    assert posts[0]["tools"][0]["function"]["name"] == "get_weather"
    follow = posts[1]["messages"]
    assert follow[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert follow[-1]["role"] == "tool" and "temperature_c" in follow[-1]["content"]
    for pane, text in calls.items():
        assert text.startswith("called get_weather({") and "-> {" in text, (pane, text)
        assert finals[pane]
    assert calls["spec"] == calls["target"]  # greedy: the same call either way
