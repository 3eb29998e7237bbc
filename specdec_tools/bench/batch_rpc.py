"""`specdec bench-batch-rpc`: one batch RPC per service per step, or N concurrent calls?

The coordinator runs every live generation in lockstep steps, each sending all their work
to each service at once: as one ProposeBatch + one VerifyBatch ("batch"), or as N Propose +
N Verify calls at once, grouped into shared passes by the services' continuous scheduler
(specdec.runtime.batching; "concurrent", via grpc futures or a thread pool). A step holds,
per session (prefilled with a random chat-length prompt), a Verify of 1 committed token + K
random drafts (greedy: only cost matters) and a Propose of K+1 tokens feeding that token,
draft and target at once. Each step commits one token, so every request keeps what the
service holds of the committed ids (keep_len, keep_digest) and drops the drafts. Reported
per (N, mode): step wall time, this process's CPU per step (what the coordinator pays),
target passes per step and sessions per pass (VerifyResponse.pass_sessions), and the
services' CPU per step when this command started them (/proc/PID/stat).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import grpc
from tqdm import tqdm

from specdec.digest import TokenPrefix
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc

MODES = ("batch", "concurrent")
GREEDY = common_pb2.SamplingParams()
TIMEOUT_S = 120.0


def _cpu_s(pid: int | None) -> float | None:
    """utime + stime of a process, in seconds (None when not ours to read)."""
    if pid is None:
        return None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _results(outcomes, what: str) -> list:
    for i, o in enumerate(outcomes):
        if o.WhichOneof("outcome") != "result":
            raise RuntimeError(f"{what} item {i} failed: {o.error.code} {o.error.message}")
    return [o.result for o in outcomes]


class Pair:
    """Stubs of a running draft and target, and the step in each mode."""

    def __init__(self, target: str, draft: str, via: str = "futures"):
        self.channels = [grpc.insecure_channel(target), grpc.insecure_channel(draft)]
        self.target = target_pb2_grpc.TargetServiceStub(self.channels[0])
        self.draft = draft_pb2_grpc.DraftServiceStub(self.channels[1])
        # a thread per call at most (threads start on demand: 2N of them are used)
        self.pool = ThreadPoolExecutor(512, "bench") if via == "threads" else None
        self.vocab = min(s.Info(common_pb2.InfoRequest(), timeout=TIMEOUT_S).vocab_size
                         for s in (self.target, self.draft))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        for c in self.channels:
            c.close()

    def send(self, mode: str, proposes: list, verifies: list) -> tuple[list, list]:
        """The step's calls, all issued before any is waited for; (proposes', verifies')."""
        if mode == "batch":
            fp = self.draft.ProposeBatch.future(
                draft_pb2.ProposeBatchRequest(items=proposes), timeout=TIMEOUT_S)
            fv = self.target.VerifyBatch.future(
                target_pb2.VerifyBatchRequest(items=verifies), timeout=TIMEOUT_S)
            return _results(fp.result().items, "ProposeBatch"), \
                _results(fv.result().items, "VerifyBatch")
        if self.pool is not None:
            fps = [self.pool.submit(self.draft.Propose, r, timeout=TIMEOUT_S) for r in proposes]
            fvs = [self.pool.submit(self.target.Verify, r, timeout=TIMEOUT_S) for r in verifies]
        else:
            fps = [self.draft.Propose.future(r, timeout=TIMEOUT_S) for r in proposes]
            fvs = [self.target.Verify.future(r, timeout=TIMEOUT_S) for r in verifies]
        return [f.result() for f in fps], [f.result() for f in fvs]


def _step_requests(sessions: list[TokenPrefix], ids: list[str], rng: random.Random,
                   vocab: int, k: int) -> tuple[list, list]:
    """Commit one random token per session; its Propose (feeding it, K+1 tokens asked) and
    Verify (it + K random drafts), both keeping what the services hold of the committed."""
    proposes, verifies = [], []
    for sid, committed in zip(ids, sessions, strict=True):
        keep = len(committed)
        digest = committed.digest_of(keep)
        token = rng.randrange(vocab)
        committed.extend([token])
        proposes.append(draft_pb2.ProposeRequest(
            session_id=sid, keep_len=keep, keep_digest=digest, new_tokens=[token],
            num_tokens=k + 1, sampling=GREEDY))
        verifies.append(target_pb2.VerifyRequest(
            session_id=sid, keep_len=keep, keep_digest=digest,
            new_tokens=[token] + [rng.randrange(vocab) for _ in range(k)], num_draft=k,
            sampling=GREEDY, round_seed=rng.getrandbits(63)))
    return proposes, verifies


def measure(pair: Pair, n: int, mode: str, steps: int, warmup: int, k: int,
            prompt_tokens: int, seed: int = 0, pids: dict | None = None,
            progress=None) -> dict:
    """One (N, mode) run on fresh sessions: prefill, `warmup` steps, `steps` timed ones."""
    rng = random.Random(seed * 1000 + n)  # the same token streams in both modes
    tag = uuid.uuid4().hex[:8]
    ids = [f"bench-batch-rpc-{tag}-{mode}-{i}" for i in range(n)]
    prompts = [[rng.randrange(pair.vocab) for _ in range(prompt_tokens)] for _ in range(n)]
    sessions = [TokenPrefix(p) for p in prompts]
    both = list(zip(ids, prompts, strict=True))
    pair.send("concurrent",  # the prefill: untimed, the same in both modes
              [draft_pb2.ProposeRequest(session_id=s, new_tokens=p, num_tokens=k + 1,
                                        sampling=GREEDY) for s, p in both],
              [target_pb2.VerifyRequest(session_id=s, new_tokens=p, sampling=GREEDY)
               for s, p in both])
    pids = pids or {}
    walls, cpus, passes, busy, tokens = [], [], [], [], []
    try:
        for i in range(warmup + steps):
            if i == warmup:
                svc0 = {role: _cpu_s(pid) for role, pid in pids.items()}
            c0, t0 = time.process_time(), time.perf_counter()
            proposes, verifies = _step_requests(sessions, ids, rng, pair.vocab, k)
            got_p, got_v = pair.send(mode, proposes, verifies)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            for committed, p, v in zip(sessions, got_p, got_v, strict=True):
                if min(p.cached_len, v.cached_len) < len(committed):
                    raise RuntimeError(f"a service holds less than the committed ids: "
                                       f"{p.cached_len}, {v.cached_len} < {len(committed)}")
            if i < warmup:
                continue
            walls.append(wall)
            cpus.append(cpu)
            passes.append(sum(1 / max(v.pass_sessions, 1) for v in got_v))
            busy.append(sum(v.pass_seconds / max(v.pass_sessions, 1) for v in got_v))
            tokens.append(sum(v.pass_tokens / max(v.pass_sessions, 1) for v in got_v))
            if progress is not None:
                progress.update()
        svc = {role: (_cpu_s(pid) - svc0[role]) * 1000 / steps for role, pid in pids.items()}
    finally:
        for sid in ids:
            for stub in (pair.draft, pair.target):
                stub.Release(common_pb2.ReleaseRequest(session_id=sid), timeout=TIMEOUT_S)
    mean_passes = statistics.mean(passes)
    return {"sessions": n, "mode": mode, "k": k, "steps": steps,
            "step_ms": statistics.median(walls) * 1000,
            "step_ms_p90": sorted(walls)[int(0.9 * (len(walls) - 1))] * 1000,
            "client_cpu_ms": statistics.mean(cpus) * 1000,
            "target_passes": mean_passes, "sessions_per_pass": n / mean_passes,
            "tokens_per_pass": statistics.mean(tokens) / mean_passes,
            "target_pass_ms": statistics.mean(busy) * 1000,
            "target_cpu_ms": svc.get("target"), "draft_cpu_ms": svc.get("draft")}


def bench(target: str, draft: str, sessions: list[int], steps: int, warmup: int, k: int,
          prompt_tokens: int, via: str = "futures", seed: int = 0, pids: dict | None = None,
          progress: bool = True) -> list[dict]:
    """Every N in `sessions` in both modes against running services; one row each."""
    pair = Pair(target, draft, via)
    bar = tqdm(total=len(sessions) * len(MODES) * steps, desc="bench-batch-rpc",
               unit="step", disable=not progress)
    try:
        rows = []
        for n in sessions:
            for mode in MODES:
                bar.set_postfix_str(f"N={n} {mode}")
                rows.append(measure(pair, n, mode, steps, warmup, k, prompt_tokens, seed,
                                    pids, bar))
        return rows
    finally:
        bar.close()
        pair.close()


def _f(x, spec=".1f") -> str:
    return "-" if x is None else f"{x:{spec}}"


def markdown(rows: list[dict], meta: dict) -> str:
    out = [f"- **Command:** `{meta['command']}` ({meta['date']})",
           f"- **Services:** {meta['services']}",
           f"- **Step:** per session a Verify of 1 committed + {meta['k']} drafts and a "
           f"Propose of {meta['k'] + 1} tokens, at once; {meta['prompt_tokens']}-token "
           f"prompts; {meta['steps']} timed steps after {meta['warmup']}; concurrent calls "
           f"via {meta['via']}", "",
           "| N | mode | step ms (median) | p90 | client CPU ms/step | target passes/step "
           "| sessions/pass | target pass ms/step | target CPU ms/step | draft CPU ms/step |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['sessions']} | {r['mode']} | {_f(r['step_ms'])} | "
                   f"{_f(r['step_ms_p90'])} | {_f(r['client_cpu_ms'], '.2f')} | "
                   f"{_f(r['target_passes'], '.2f')} | {_f(r['sessions_per_pass'])} | "
                   f"{_f(r['target_pass_ms'])} | {_f(r['target_cpu_ms'])} | "
                   f"{_f(r['draft_cpu_ms'])} |")
    by = {(r["sessions"], r["mode"]): r for r in rows}
    ratios = [f"N={n}: {by[n, 'concurrent']['step_ms'] / by[n, 'batch']['step_ms']:.2f}x step "
              f"time, {by[n, 'concurrent']['client_cpu_ms'] / by[n, 'batch']['client_cpu_ms']:.2f}x"
              " client CPU" for n in sorted({r["sessions"] for r in rows})
              if (n, "batch") in by and (n, "concurrent") in by]
    if ratios:
        out += ["", "Concurrent relative to batch: " + "; ".join(ratios) + "."]
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style in zip(MODES, ("o-", "s--"), strict=True):
        rs = [r for r in rows if r["mode"] == mode]
        ax.plot([r["sessions"] for r in rs], [r["step_ms"] for r in rs], style, label=mode)
        bx.plot([r["sessions"] for r in rs], [r["client_cpu_ms"] for r in rs], style, label=mode)
    ax.set(xlabel="sessions per step (N)", ylabel="step wall ms (median)",
           title="lockstep step time")
    bx.set(xlabel="sessions per step (N)", ylabel="client CPU ms per step",
           title="what the coordinator pays")
    for a in (ax, bx):
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(rows: list[dict], meta: dict, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "batch_rpc.json", "md": out / "batch_rpc.md",
             "png": out / "batch_rpc.png"}
    paths["json"].write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    paths["md"].write_text(markdown(rows, meta))
    plot(rows, paths["png"])
    return paths


def run(args: argparse.Namespace) -> int:
    from specdec import pair as pairs

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    sessions = [int(x) for x in args.sessions.split(",") if x.strip()]
    if (args.target is None) != (args.draft is None):
        say("error: give both --target and --draft, or neither")
        return 2
    if not sessions or min(sessions) < 1 or args.steps < 1 or args.k < 1:
        say("error: --sessions, --steps and --k must be positive")
        return 2
    with ExitStack() as stack:
        if args.target:
            target, draft, pids = args.target, args.draft, {}
            services = f"running services: target {target}, draft {draft}"
        else:
            from specdec.prepare import prepare_smollm2
            from specdec.runtime.openvino_export import export

            spec, hf = pairs.DEFAULT_PAIR, prepare_smollm2()  # the IRs: cached
            export(hf, spec.target.weights, say=say)
            export(hf, spec.draft.weights, say=say)
            say(f"== starting {spec.name}")
            running = pairs.start(spec, stack, pin=not args.no_pin)
            target, draft = running.target.address, running.draft.address
            pids = {role: p.proc.pid for role, p in running.processes().items()}
            services = f"{spec.name} ({spec.target.model}), CPUs {running.cpus}"
        rows = bench(target, draft, sessions, args.steps, args.warmup, args.k,
                     args.prompt_tokens, args.concurrent_via, args.seed, pids)
    meta = {"command": " ".join(["specdec"] + sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
            "services": services, "k": args.k, "steps": args.steps, "warmup": args.warmup,
            "prompt_tokens": args.prompt_tokens, "via": args.concurrent_via,
            "client_cpus": len(os.sched_getaffinity(0))}
    paths = write(rows, meta, Path(args.out))
    print(markdown(rows, meta))
    say("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-batch-rpc", help="lockstep steps: one batch RPC per service, or N concurrent calls",
        description="Times lockstep steps of N sessions (a Verify of 1 committed token + K "
                    "drafts and a Propose of K+1 tokens per session, draft and target at "
                    "once) sent as one ProposeBatch + one VerifyBatch, or as N concurrent "
                    "Propose + N Verify calls grouped by the services' scheduler. Writes "
                    "batch_rpc.json, batch_rpc.md and batch_rpc.png.")
    p.add_argument("--target", default=None,
                   help="HOST:PORT of a running target (with --draft); default: start the "
                        "default pair (specdec.pair.DEFAULT_PAIR), pinned as `specdec up` does")
    p.add_argument("--draft", default=None, help="HOST:PORT of a running draft (with --target)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the started services to one CPU each")
    p.add_argument("--sessions", default="1,4,8,16,32",
                   help="numbers of sessions N per step, comma-separated (default: %(default)s)")
    p.add_argument("--steps", type=int, default=30,
                   help="timed steps per (N, mode) (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps before them (default: %(default)s)")
    p.add_argument("--k", type=int, default=3, help="drafts per Verify (default: %(default)s)")
    p.add_argument("--prompt-tokens", type=int, default=60,
                   help="random prompt prefilled per session (default: %(default)s)")
    p.add_argument("--concurrent-via", choices=("futures", "threads"), default="futures",
                   help="how the concurrent mode issues its calls: grpc futures, or blocking "
                        "calls from a pool of 2N threads (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="token seed (default: %(default)s)")
    p.add_argument("--out", default="bench-results/batch-rpc",
                   help="folder for the results (default: %(default)s)")
    p.set_defaults(func=run)
