"""What automatic prefix caching saves on time to first token (docs/design.md,
"Automatic prefix caching").

A target-service-style prefill (a new session, keep_len 0, the whole prompt fed, the
last position's logits asked for; through CachedModel and its scheduler, as a Verify
runs it, without the RPC) of a ~N-token prompt of several lines, timed three ways per
repeat, each in a new session:

  first    a prompt never seen (its first line names the repeat)
  repeat   the same prompt again
  shared   the same prompt with its last line replaced

and reported as medians and the median per-repeat ratios repeat/first, shared/first.
--no-prefix-cache runs the same with the cache off (ratios near 1).

  .venv/bin/python -m specdec_tools.bench.prefix_ttft --repeats 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

LINES = ("The river ran past the old mill, where the miller counted sacks of grain.",
         "Every morning the baker lit the ovens before the first cart came up the hill.",
         "A letter from the coast said the storms had kept the fishing boats in harbour.",
         "Children ran along the wall to watch the soldiers march out of the east gate.",
         "In the square, the clockmaker argued with the mayor about the price of brass.")


def prompt_lines(tokenizer, repeat: int, tokens: int) -> list[str]:
    """Lines of text of about `tokens` tokens, the first naming `repeat`."""
    lines = [f"Chronicle number {repeat} of the town, as the scribes wrote it."]
    i = 0
    while len(tokenizer("\n".join(lines))["input_ids"]) < tokens:
        lines.append(f"{i + 1}. {LINES[(i * 3 + repeat) % len(LINES)]}")
        i += 1
    return lines


def time_prefill(model, session_id: str, tokens: list[int]) -> float:
    """Seconds for one new session's prefill of `tokens` (the last position's logits)."""
    from specdec.sync import SyncRequest

    t0 = time.perf_counter()
    with model.store.use(session_id, 0, 0) as session:
        model.sync(session, SyncRequest(session_id, 0, 0, tokens), keep_last=1)
    seconds = time.perf_counter() - t0
    model.release(session_id)
    return seconds


def measure(model, tokenizer, tokens: int, repeats: int) -> dict:
    times: dict[str, list[float]] = {"first": [], "repeat": [], "shared": []}
    for r in range(-1, repeats):  # repeat -1 warms the shapes up and is not counted
        lines = prompt_lines(tokenizer, r, tokens)
        prompt = tokenizer("\n".join(lines))["input_ids"]
        other = tokenizer("\n".join(lines[:-1] + ["The end came quietly, as it always did."])
                          )["input_ids"]
        row = {"first": time_prefill(model, f"first-{r}", prompt),
               "repeat": time_prefill(model, f"repeat-{r}", prompt),
               "shared": time_prefill(model, f"shared-{r}", other)}
        if r >= 0:
            for kind, seconds in row.items():
                times[kind].append(seconds)
    pairs = zip(prompt, other, strict=False)
    common = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(prompt), len(other)))
    out = {"prompt_tokens": len(prompt), "shared_prompt_tokens": len(other),
           "shared_common_prefix": common, "repeats": repeats}
    for kind, values in times.items():
        out[f"{kind}_ms"] = round(1000 * statistics.median(values), 2)
    for kind in ("repeat", "shared"):
        out[f"{kind}_over_first"] = round(statistics.median(
            a / b for a, b in zip(times[kind], times["first"], strict=True)), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec_tools.bench.prefix_ttft",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m",
                   help="model name (a prepared or tiny model; default: the default "
                        "pair's target, smollm2-135m)")
    p.add_argument("--weights", default="fp32",
                   help="which prepared OpenVINO IR (default fp32, the default target's)")
    p.add_argument("--tokens", type=int, default=600, help="prompt length, about")
    p.add_argument("--repeats", type=int, default=5, help="measured repeats (medians)")
    p.add_argument("--threads", type=int, default=0,
                   help="OpenVINO inference threads (0: the plugin's default)")
    p.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="the paged backend's prefix cache (on by default)")
    args = p.parse_args(argv)

    from specdec.runtime.cached_model import CachedModel
    from specdec.runtime.openvino_export import resolve_ir
    from specdec.runtime.openvino_paged import PagedOpenVINOBackend

    ir_dir, model_id = resolve_ir(args.model, args.weights)
    backend = PagedOpenVINOBackend(ir_dir, "CPU", args.threads, model_id=model_id,
                                   prefix_cache=args.prefix_cache)
    model = CachedModel(backend)
    try:
        result = measure(model, backend.loaded.tokenizer, args.tokens, args.repeats)
    finally:
        model.close()
    result.update(model=model_id, prefix_cache=args.prefix_cache,
                  stats=None if backend.prefix_cache_stats is None
                  else vars(backend.prefix_cache_stats))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
