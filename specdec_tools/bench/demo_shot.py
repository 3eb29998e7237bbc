"""A screenshot of the coordinator's browser demo (/demo) with the real model, for the docs.

Starts the real stack on loopback (SmolLM2-135M: OpenVINO fp32 target, int8 draft, as
`specdec up`; needs `make prepare`) with its HTTP API on, warms it up, opens /demo in
headless Chromium (`make browser`), runs one greedy generation with the target-only
comparison on, waits for it to finish and saves the window as a PNG:

    .venv/bin/python -m specdec_tools.bench.demo_shot --out docs/img/demo.png

With --url it uses a server that is already running instead of starting one.
"""

from __future__ import annotations

import argparse
import logging
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx

from specdec_tools.bench import browser
from specdec_tools.bench.drain import free_port

PROMPT = ("What is speculative decoding, and why does it make a large language model "
          "answer faster without changing what it says?")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m specdec_tools.bench.demo_shot",
        description="Start the real stack (unless --url), run one compare-on greedy "
                    "generation in the /demo page in headless Chromium and save a "
                    "screenshot of it.")
    p.add_argument("--out", type=Path, default=Path("docs/img/demo.png"),
                   help="where to write the PNG; folders are created (default: %(default)s)")
    p.add_argument("--prompt", default=PROMPT, help="the chat prompt typed into the page")
    p.add_argument("--max-tokens", type=int, default=96,
                   help="max tokens of each of the two generations (default: %(default)s)")
    p.add_argument("--k", type=int, default=None,
                   help="draft tokens per round typed into the page (default: the server's "
                        "default_num_draft_tokens from /v1/models, which the page shows)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 = greedy, where both panes must agree "
                        "(default: %(default)s)")
    p.add_argument("--url", default=None,
                   help="base URL of a running coordinator's HTTP API (e.g. "
                        "http://127.0.0.1:8000); default: start the stack here on free "
                        "loopback ports and stop it afterwards")
    p.add_argument("--http-port", type=int, default=0,
                   help="HTTP port for the stack started here (default: a free one)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the draft and target services to one CPU each")
    p.add_argument("--window", default="1400x1000", metavar="WxH",
                   help="browser window size in pixels, which is the screenshot's size "
                        "(default: %(default)s)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for the page's generation to finish "
                        "(default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2,
                   help="short API requests (speculative and target-only) before the shot, "
                        "so first-call costs do not show in its speeds (default: %(default)s)")
    return p.parse_args(argv)


def warm_up(base: str, model: str, times: int, k: int | None) -> None:
    for _ in range(times):
        for draft in (k, 0):
            body = {"model": model, "messages": [{"role": "user", "content": "Hello!"}],
                    "max_tokens": 16, "temperature": 0}
            if draft is not None:
                body["num_draft_tokens"] = draft
            r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
            r.raise_for_status()


def shoot(args: argparse.Namespace, base: str) -> int:
    model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
    warm_up(base, model, args.warmup, args.k)
    width, height = (int(v) for v in args.window.lower().split("x"))
    with browser.chromium(width, height) as driver:
        browser.open_demo(driver, base)
        state = browser.generate(driver, prompt=args.prompt, k=args.k,
                                 temperature=args.temperature, max_tokens=args.max_tokens,
                                 compare=True, timeout=args.timeout)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
        print(f"page state: {state}; {browser.text(driver, 'speedup')}", flush=True)
        print(f"screenshot: {args.out}", flush=True)
        if state != "done":
            print(f"error: {browser.text(driver, 'error')}", file=sys.stderr)
            return 1
        same = browser.text(driver, "answer-spec") == browser.text(driver, "answer-target")
        if args.temperature == 0 and not same:
            print("error: the greedy speculative and target-only texts differ",
                  file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    why = browser.missing()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    if args.url:
        return shoot(args, args.url.rstrip("/"))
    from specdec import stack

    cfg = stack.StackConfig(http_port=args.http_port or free_port(), port=free_port(),
                            draft_port=free_port(), target_port=free_port(),
                            pin=not args.no_pin)
    with ExitStack() as es:
        running = stack.start(cfg, es)
        return shoot(args, running.http_url)


if __name__ == "__main__":
    sys.exit(main())
