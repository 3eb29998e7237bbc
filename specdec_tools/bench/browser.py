"""Headless Chromium (Debian's packages, `make browser`) driven by Selenium, and the
coordinator's /demo page (coordinator/api/demo.html) worked through it: one place for the
browser test (tests/e2e/test_demo_page.py) and the docs screenshot
(specdec_tools.bench.demo_shot).

The browser and its driver are the system's /usr/bin/chromium and /usr/bin/chromedriver,
never downloaded: with the driver's path given, Selenium does not run selenium-manager.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# --disable-background-networking and friends: without them Chromium tries to reach
# Google's hosts (updates, sync, field trials), which a closed network refuses.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")
FINAL_STATES = ("done", "error", "stopped")  # the page's body[data-state] when it is over


class BrowserMissing(RuntimeError):
    """Chromium or its WebDriver is not installed (or selenium is not)."""


def missing() -> str | None:
    """Why the browser cannot start, naming the fix; None when it can."""
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if absent:
        return (f"{' and '.join(absent)} missing: run `make browser` (as root it installs "
                "Debian's chromium and chromium-driver; otherwise `sudo apt-get install -y "
                "chromium chromium-driver`)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is missing: `make setup` installs it (the dev extra)"
    return None


@contextmanager
def chromium(width: int = 1400, height: int = 1000,
             accept_insecure_certs: bool = False) -> Iterator:
    """A headless Chromium WebDriver with a fresh, empty profile; quit on exit.
    accept_insecure_certs: take any server certificate (a page served over HTTPS with a
    development CA the browser does not know)."""
    why = missing()
    if why:
        raise BrowserMissing(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="specdec-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        options.accept_insecure_certs = accept_insecure_certs
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        try:
            yield driver
        finally:
            driver.quit()


# -- the demo page ----------------------------------------------------------------------


def state(driver) -> str:
    return driver.execute_script("return document.body.dataset.state")


def wait_state(driver, states: tuple[str, ...], timeout: float) -> str:
    """Poll body[data-state] until it is one of `states`; TimeoutError past `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        now = state(driver)
        if now in states:
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"the demo page stayed {now!r} for {timeout:.0f} s "
                               f"(status: {text(driver, 'status')!r}, "
                               f"error: {text(driver, 'error')!r})")
        time.sleep(0.1)


def open_demo(driver, base_url: str, timeout: float = 30) -> None:
    """Load <base_url>/demo and wait until it has the model card (state idle)."""
    driver.get(base_url.rstrip("/") + "/demo")
    got = wait_state(driver, ("idle", "error"), timeout)
    if got != "idle":
        raise RuntimeError(f"the demo page could not load the model: {text(driver, 'error')}")


def fill(driver, element_id: str, value) -> None:
    """Type `value` into a field, as a user would (after clearing it)."""
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(str(value))


def generate(driver, *, prompt: str, k: int | None, max_tokens: int, temperature: float = 0,
             seed: int | None = None, compare: bool = True, timeout: float = 90) -> str:
    """Fill the form, click Generate and wait for the page's final state (returned)."""
    from selenium.webdriver.common.by import By

    fill(driver, "prompt", prompt)
    if k is not None:
        fill(driver, "k", k)
    fill(driver, "temperature", f"{temperature:g}")
    fill(driver, "max-tokens", max_tokens)
    if seed is not None:
        fill(driver, "seed", seed)
    box = driver.find_element(By.ID, "compare")
    if box.is_selected() != compare:
        box.click()
    run = int(driver.execute_script("return document.body.dataset.run"))
    driver.find_element(By.ID, "generate").click()
    # body[data-run] counts Generate clicks: the final state must be this run's.
    deadline = time.monotonic() + 10
    while int(driver.execute_script("return document.body.dataset.run")) == run:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Generate did not start a run (state {state(driver)!r})")
        time.sleep(0.05)
    return wait_state(driver, FINAL_STATES, timeout)


def text(driver, element_id: str) -> str:
    """An element's exact textContent (whitespace as is; '' when there is none)."""
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.textContent : ''",
        element_id)


def kinds(driver, pane: str) -> list[str]:
    """The data-kind of each token span of a pane ("spec" or "target"), in order."""
    return driver.execute_script(
        "return [...document.querySelectorAll(`#answer-${arguments[0]} span.tok`)]"
        ".map(s => s.dataset.kind)", pane)


def stats(driver, pane: str) -> dict[str, str]:
    """A pane's stats as shown: {data-stat key: text}."""
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll(`#stats-${arguments[0]} dd`)]"
        ".map(d => [d.dataset.stat, d.textContent]))", pane)
