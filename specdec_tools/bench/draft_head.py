"""`specdec bench-draft-head`: what an FR-Spec head of N tokens saves the draft, and what
it costs in acceptance.

FR-Spec (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling") cuts the draft's LM head to the N most frequent
tokens (specdec.runtime.fr_vocab ranks them, specdec.runtime.fr_head exports the draft).
For each N (0 = the full head) this measures, on the backend the draft service runs (the
paged OpenVINO graph, no RPC):

  pass time     a forward pass of 1 token per session at 1 and 8 sessions (a draft step),
                including the scatter of the N logits back to the full vocabulary, the
                sessions holding `--context` tokens, pinned with `--cpu`; the head sizes
                are interleaved, so a drifting machine load hits all of them alike;
  acceptance    along the target's greedy text of the chat prompts
                (specdec_tools.bench.chat_prompts, never used for the ranking), teacher-forced:
                the share of positions where the draft's greedy token is the target's
                (greedy acceptance per token), and the expected acceptance at
                temperature 1, sum_x min(p(x), q(x)) with q the draft's softmax over its
                head (renormalised; the service's sparse top-n/top-mass cut of q is left
                out); plus the share of the target's tokens the head holds, an upper
                bound of both.

The acceptance passes run with the CPU plugin's dynamic quantization off, so a
teacher-forced prefill computes each position as the draft's one-token steps do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

FULL = 0


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}"
                                         ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def draft_ir(model: str, weights: str, head: int, say=print) -> Path:
    """The draft's IR with a head of `head` tokens (0 = full), exported first if need be
    (a prepared model's ranking and exports are cached, as `specdec prepare` makes them)."""
    from specdec import paths
    from specdec.runtime.openvino_export import export, resolve_ir

    if model in paths.PREPARED_NAMES:
        from specdec.prepare import prepare_smollm2

        return export(prepare_smollm2(), weights, say=say, head_vocab=head)
    return resolve_ir(model, weights, (), head)[0]


def backend(ir: Path, threads: int, dynamic_quantization: bool = True):
    from specdec.runtime.openvino_paged import PagedOpenVINOBackend

    return PagedOpenVINOBackend(ir, "CPU", threads, inference_precision="f32",
                                dynamic_quantization=dynamic_quantization,
                                compressed_weights=True)


def _cycle(items: list, n: int) -> list:
    return [items[i % len(items)] for i in range(n)]


def time_passes(backends: dict[int, object], sessions: list[int], contexts: list[list[int]],
                passes: int, repeats: int, warm: int = 2,
                progress: bool = True) -> dict[tuple[int, int], float]:
    """Median ms of a pass of 1 token per session, per (head, sessions). Every pass is
    cropped back, so each sees the same context; heads and session counts take turns."""
    times: dict[tuple[int, int], list[float]] = {(h, s): [] for h in backends for s in sessions}
    bar = tqdm(total=repeats * len(times), desc="draft passes", unit="run",
               disable=not progress)
    for _ in range(repeats):
        for head, b in backends.items():
            for s in sessions:
                caches = [b.new_cache() for _ in range(s)]
                b.forward_batch([(c, ctx, 1)
                                 for c, ctx in zip(caches, _cycle(contexts, s), strict=True)])
                lengths = [b.cache_len(c) for c in caches]
                for i in range(warm + passes):
                    items = [(c, [ctx[i % len(ctx)]], 1)
                             for c, ctx in zip(caches, _cycle(contexts, s), strict=True)]
                    t0 = time.perf_counter()
                    b.forward_batch(items)
                    seconds = time.perf_counter() - t0
                    for c, n in zip(caches, lengths, strict=True):
                        b.crop(c, n)
                    if i >= warm:
                        times[head, s].append(seconds)
                del caches
                bar.update()
    bar.close()
    return {key: statistics.median(v) * 1000 for key, v in times.items()}


def target_rows(target, prompts: list[list[int]], texts: list[list[int]]) -> list[torch.Tensor]:
    """The target's distribution at temperature 1 at every position of its texts."""
    out = []
    for prompt, text in zip(prompts, texts, strict=True):
        logits = target.forward(target.new_cache(), prompt + text[:-1], keep_last=len(text))
        out.append(torch.softmax(logits.float(), -1))
    return out


def acceptance(draft, prompts: list[list[int]], texts: list[list[int]],
               p_rows: list[torch.Tensor]) -> dict:
    """Teacher-forced along the target's texts: greedy acceptance per token, expected
    sampled acceptance at temperature 1 (mean of sum_x min(p, q)), and how many of the
    target's tokens the draft can propose at all (q > 0)."""
    hits = expected = inside = positions = 0.0
    for prompt, text, p in zip(prompts, texts, p_rows, strict=True):
        logits = draft.forward(draft.new_cache(), prompt + text[:-1], keep_last=len(text))
        q = torch.softmax(logits.float(), -1)  # -inf outside a sliced head: q = 0 there
        truth = torch.tensor(text)
        hits += float((logits.argmax(-1) == truth).sum())
        expected += float(torch.minimum(p, q).sum())
        inside += float((q.gather(1, truth[:, None]) > 0).sum())
        positions += len(text)
    return {"positions": int(positions), "greedy_acceptance": hits / positions,
            "sampled_acceptance": expected / positions, "head_coverage": inside / positions}


def markdown(rows: list[dict], meta: dict) -> str:
    sessions = [str(s) for s in meta["sessions"]]
    out = [f"- **Command:** `{meta['command']}` ({meta['date']})",
           f"- **Draft:** {meta['draft']}", f"- **Acceptance:** {meta['acceptance_on']}", "",
           "| head (tokens) | " + " | ".join(f"pass ms, {s} session(s) | vs full"
                                             for s in sessions)
           + " | greedy acceptance | sampled acceptance (T=1) | target tokens in head |",
           "|---|" + "---|---|" * len(sessions) + "---|---|---|"]

    def f(x, spec=".3f"):
        return "-" if x is None else f"{x:{spec}}"

    for r in rows:
        timing = " | ".join(f"{f(r['ms'][s], '.2f')} | {f(r['vs_full'][s])}" for s in sessions)
        out.append(f"| {r['label']} | {timing} | {f(r.get('greedy_acceptance'))} | "
                   f"{f(r.get('sampled_acceptance'))} | {f(r.get('head_coverage'))} |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], sessions: list[int], path: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["tokens"] for r in rows]  # the full head at the vocabulary's size
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [r["label"].replace(" (", "\n(") for r in rows])
        ax.minorticks_off()
    for s in sessions:
        a.plot(x, [r["ms"][str(s)] for r in rows], "o-", label=f"{s} session(s)")
    a.set_xlabel("head size (tokens)")
    a.set_ylabel("ms per draft pass (median)")
    a.set_title("draft pass, 1 token per session")
    a.legend()
    if "greedy_acceptance" in rows[0]:
        for key, label in (("greedy_acceptance", "greedy"),
                           ("sampled_acceptance", "sampled, T=1"),
                           ("head_coverage", "target tokens in head")):
            b.plot(x, [r[key] for r in rows], "o-", label=label)
        b.set_xlabel("head size (tokens)")
        b.set_ylabel("per token")
        b.set_title("acceptance along the target's text")
        b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> int:
    from specdec.runtime.fr_vocab import Recipe, _chat_ids, generate
    from specdec.runtime.models import load_tokenizer
    from specdec.service_cli import load_backend
    from specdec.service_config import ModelServiceConfig
    from specdec_tools.bench import chat_prompts

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    for flag, value in (("--passes", args.passes), ("--repeats", args.repeats),
                        ("--context", args.context)):
        if value < 1:
            print(f"error: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    heads = list(dict.fromkeys(args.heads))
    sessions = sorted(set(args.sessions))
    say(f"== draft IRs ({args.weights}) with heads {heads} (exported once, cached)")
    irs = {h: draft_ir(args.model, args.weights, h, say) for h in heads}
    timed = {h: backend(ir, args.threads) for h, ir in irs.items()}
    tokenizer = load_tokenizer(args.model)
    messages = [m for _, m in chat_prompts.PROMPTS][:args.prompts or None]
    prompts = [_chat_ids(tokenizer, m) for m in messages]
    contexts = [(p * (args.context // len(p) + 1))[:args.context] for p in prompts]
    say(f"== timing passes of 1 token per session at {sessions} session(s), "
        f"{args.passes} passes x {args.repeats} repeats")
    ms = time_passes(timed, sessions, contexts, args.passes, args.repeats)
    del timed
    accept: dict[int, dict] = {}
    if args.max_new_tokens > 0:
        say(f"== the target's greedy text of {len(prompts)} chat prompts, "
            f"{args.max_new_tokens} tokens each")
        target = load_backend(ModelServiceConfig(model=args.model, backend="openvino",
                                                 weights="fp32", kv_layout="paged",
                                                 threads=args.threads))
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        recipe = Recipe(max_new_tokens=args.max_new_tokens, temperatures=(0.0,),
                        batch=len(prompts), prompts=tuple(messages))
        texts = generate(target, prompts, recipe, eos, desc="target text")
        p_rows = target_rows(target, prompts, texts)
        del target
        for h in tqdm(heads, desc="acceptance", unit="head"):
            accept[h] = acceptance(backend(irs[h], args.threads, dynamic_quantization=False),
                                   prompts, texts, p_rows)
    vocab = int(json.loads((irs[heads[0]] / "config.json").read_text())["vocab_size"])
    base = FULL in heads
    rows = [{"head_vocab": h, "tokens": h or vocab,
             "label": f"full ({vocab})" if h == FULL else str(h), "ir": str(irs[h]),
             "ms": {str(s): ms[h, s] for s in sessions},
             "vs_full": {str(s): ms[h, s] / ms[FULL, s] if base else None for s in sessions},
             **accept.get(h, {})} for h in sorted(heads, key=lambda h: h or vocab)]
    meta = {"command": " ".join(["specdec"] + sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
            "draft": f"{args.model}, {args.weights} weights, f32, paged OpenVINO, "
                     f"{args.threads} thread(s), CPU {sorted(os.sched_getaffinity(0))}, "
                     f"{args.context}-token context, {args.passes} passes x {args.repeats} "
                     f"repeats (median); full vocabulary {vocab or '?'}",
            "acceptance_on": f"{len(prompts)} chat prompts (specdec_tools.bench.chat_prompts), the "
                             f"target's ({args.model} fp32) greedy text, {args.max_new_tokens} "
                             "new tokens each, teacher-forced" if accept else "not measured",
            "sessions": sessions}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, meta)
    (out / "draft_head.md").write_text(md)
    (out / "draft_head.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    png = plot(rows, sessions, out / "draft_head.png")
    print(md)
    say(f"wrote {out / 'draft_head.json'}, {out / 'draft_head.md'}"
        + (f", {png}" if png else ""))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-draft-head",
        help="FR-Spec: the draft's pass time and acceptance by LM-head size",
        description="For each FR-Spec head size N (the draft's LM head cut to the N tokens "
                    "the model generates most; 0 = the full head): the draft's paged "
                    "forward pass of 1 token per session (as a draft step), and its "
                    "acceptance along the target's greedy text of the chat prompts "
                    "(greedy per token, and expected at temperature 1). Missing sliced IRs "
                    "are exported first (as specdec prepare --head-vocab N). Writes "
                    "draft_head.json, draft_head.md and draft_head.png.")
    p.add_argument("--model", default="smollm2-135m",
                   help="model, the draft's and the target's (default: %(default)s)")
    p.add_argument("--weights", default="int8", choices=["fp32", "int8", "int4"],
                   help="the draft IR's weights (default: %(default)s, as the services' "
                        "draft); the target is always fp32")
    p.add_argument("--heads", type=_ints, default=[0, 2048, 4096, 8192, 16384],
                   metavar="N,N,...",
                   help="head sizes, comma-separated; 0 = the full head, the baseline of "
                        "the 'vs full' columns (default: 0,2048,4096,8192,16384)")
    p.add_argument("--sessions", type=_ints, default=[1, 8], metavar="S,S",
                   help="sessions per timed pass, 1 token each (default: 1,8)")
    p.add_argument("--passes", type=int, default=30,
                   help="timed passes per run, after 2 warm ones (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per head size and session count, interleaved; medians over "
                        "all (default: %(default)s)")
    p.add_argument("--context", type=int, default=64,
                   help="tokens each timed session holds (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1,
                   help="inference threads (default: %(default)s, as the services' draft)")
    p.add_argument("--cpu", type=int, default=None,
                   help="pin this process to this CPU (default: not pinned)")
    p.add_argument("--prompts", type=int, default=0,
                   help="use only the first N chat prompts for acceptance; 0 = all 16 "
                        "(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens of the target's greedy text per prompt; 0 = skip the "
                        "acceptance measurement (default: %(default)s)")
    p.add_argument("--out", default="bench-results",
                   help="folder for draft_head.json, .md and .png (default: %(default)s)")
    p.set_defaults(func=run)
