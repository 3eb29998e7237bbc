"""What one replica of each piece does, measured: the figures docs/scaling.md sizes a
cluster from (`specdec bench-scale --runs sizing`; no namespaces needed).

The default pair (SmolLM2-135M: OpenVINO fp32 target, int8 draft), each service pinned
to one core with one thread, as `specdec bench` runs it; the coordinator's loop in this
process. For N closed-loop streams of chat requests (the shipped prompts, greedy, 64 new
tokens), target-only (K=0) and speculative (K left to the coordinator: 4, pipelined,
load-aware, the model drafter): the
aggregate tok/s, rounds/s, what the target verified and the draft proposed per second,
how busy each service's core was (its process CPU time over the wall time), the
coordinator's CPU per round (this process's CPU time over the rounds: the loop, gRPC,
the tokenizer; the clients' own share is small), RPCs and bytes per round.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass

from specdec_tools.bench import prompts as bench_prompts

MAX_NEW = 64


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(service, pids: dict[str, int], streams: int, k: int, seconds: float,
             refs: dict[str, list[int]], mismatches: list[str]) -> dict:
    from specdec.v1 import generate_pb2
    from specdec_tools.bench.system import _clients

    messages = [m for _, m in bench_prompts.PROMPTS]
    totals = {"tokens": 0, "rounds": 0, "drafted": 0, "accepted": 0, "generations": 0}
    lock, stop = threading.Lock(), threading.Event()

    def stream(i: int) -> None:
        j = i
        while not stop.is_set():
            message = messages[j % len(messages)]
            req = generate_pb2.GenerateRequest(max_new_tokens=MAX_NEW)
            req.messages.add(role="user", content=message)
            if k is not None:
                req.num_draft_tokens = k
            resp = service.generate(req)
            with lock:
                ids = list(resp.token_ids)
                if refs.setdefault(message, ids) != ids:  # greedy: target-only's ids
                    mismatches.append(f"K={k}, {streams} streams: {message[:40]!r}")
                s = resp.stats
                totals["tokens"] += s.generated_tokens
                totals["rounds"] += s.rounds
                totals["drafted"] += s.drafted_tokens
                totals["accepted"] += s.accepted_tokens
                totals["generations"] += 1
            j += streams

    clients = _clients(service)
    calls0 = [len(c.bytes.recent) for c in clients]
    bytes0 = [c.bytes.sent + c.bytes.received for c in clients]
    cpu0 = {r: _cpu_s(p) for r, p in pids.items()}
    me0, t0 = time.process_time(), time.monotonic()
    threads = [threading.Thread(target=stream, args=(i,), daemon=True)
               for i in range(streams)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall, me = time.monotonic() - t0, time.process_time() - me0
    busy = {r: (_cpu_s(p) - cpu0[r]) / wall for r, p in pids.items()}
    calls = sum(len(c.bytes.recent) - n for c, n in zip(clients, calls0, strict=True))
    nbytes = sum(c.bytes.sent + c.bytes.received - n for c, n in
                 zip(clients, bytes0, strict=True))
    rounds = max(1, totals["rounds"])
    return {
        "streams": streams, "k": "server" if k is None else k, "seconds": round(wall, 1),
        "generations": totals["generations"],
        "tok_s": round(totals["tokens"] / wall, 1),
        "rounds_s": round(totals["rounds"] / wall, 1),
        "verified_tok_s": round((totals["rounds"] + totals["drafted"]) / wall, 1),
        "drafted_tok_s": round(totals["drafted"] / wall, 1),
        "acceptance": round(totals["accepted"] / totals["drafted"], 3)
        if totals["drafted"] else None,
        "busy": {r: round(b, 2) for r, b in busy.items()},
        "coordinator_cpu_ms_per_round": round(1000 * me / rounds, 2),
        "rpcs_per_round": round(calls / rounds, 2),
        "bytes_per_round": round(nbytes / rounds),
    }


@dataclass(frozen=True)
class Size:
    streams: tuple[int, ...]
    seconds: float  # per (mode, streams) window


SHORT = Size(streams=(1, 4), seconds=8)
FULL = Size(streams=(1, 4, 8, 16), seconds=20)


def sizing(size: Size = FULL) -> dict:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service
    from specdec import pair as pairs
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export

    hf = prepare_smollm2()
    export(hf, "fp32"), export(hf, "int8")
    pair = pairs.DEFAULT_PAIR.with_threads(1)
    pair = pairs.Pair(pair.name, pair.target.with_(inference_precision="f32"), pair.draft)
    with ExitStack() as stack:
        running = pairs.start(pair, stack, pin=True)
        target, draft = running.target.address, running.draft.address
        pids = {"target": running.target.proc.pid, "draft": running.draft.proc.pid}
        alone = build_service(CoordinatorConfig(target=target, draft="", drafter="model",
                                                max_concurrency=64))
        spec = build_service(CoordinatorConfig(target=target, draft=draft, drafter="model",
                                               max_concurrency=64))
        rows, refs, mismatches = [], {}, []
        for n in size.streams:
            # K left to the coordinator, as clients of a deployment leave it: K=4,
            # pipelined, load-aware K (it drafts less when the target is the bottleneck).
            for mode, service, k in (("target-only", alone, 0), ("speculative", spec, None)):
                rows.append({"mode": mode, **_measure(service, pids, n, k, size.seconds, refs,
                                                      mismatches)})
    return {"pair": pair.name, "max_new_tokens": MAX_NEW, "rows": rows,
            "generations": sum(r["generations"] for r in rows), "errors": [],
            "mismatches": mismatches[:20], "exact": not mismatches}
