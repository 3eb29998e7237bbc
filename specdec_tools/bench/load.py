"""`specdec load`: N concurrent client streams through the coordinator's gRPC streaming API.

Each stream is a thread with its own channel and its own closed loop of requests (the
next request goes out when the previous answer ends), over a fixed prompt mix
(specdec_tools.bench.prompts; stream s sends prompt (s + i) mod 8 as its i-th request, so
streams differ). One measurement *window* is one scenario at one concurrency N: all N
streams start together and the window ends with the last answer. Two loop variants go
through the same system, interleaved per concurrency level: target-only (the request
says num_draft_tokens = 0, as specdec_tools.bench.system does) and the coordinator's default
speculative loop (num_draft_tokens left unset, so the coordinator applies its default K;
generate.proto: "0 = target only; unset = server default"). `--api http` runs the same
variants through the coordinator's OpenAI-compatible HTTP API with SSE streaming
(specdec_tools.bench.load_http), interleaved with the gRPC ones. Peers under load
(specdec_tools.bench.load_peers) produce the same windows. The records (Load, LoadSample,
Window), the statistics and the outputs are in specdec_tools.bench.load_report.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from specdec_tools.bench.load_http import HttpVariant, run_streams
from specdec_tools.bench.load_report import Load, LoadSample, Window
from specdec_tools.bench.system import BASELINE

SPECULATIVE = "specdec (coordinator's default K)"


def _chat_prompts():
    from specdec_tools.bench.chat_prompts import PROMPTS
    return PROMPTS


def _bench_prompts():
    from specdec_tools.bench.prompts import PROMPTS
    return PROMPTS


# --prompts: which fixed prompt mix the streams send.
PROMPT_SETS = {"chat": _chat_prompts, "bench": _bench_prompts}
APIS = ("grpc", "http")


class GrpcVariant:
    """One loop variant through a coordinator's Generator.GenerateStream: `k` 0 =
    target-only, None = the coordinator's default K (num_draft_tokens left unset)."""

    api = "grpc"
    reference_api = None  # its own reference windows
    may_fail = False
    connect_timeout_s = 60.0

    def __init__(self, address: str, k: int | None, name: str, baseline: str | None = None,
                 tls=None):
        self.address, self.k, self.name, self.baseline = address, k, name, baseline
        self.tls = tls  # specdec.tls.ClientTLS for a coordinator with --api-tls-cert

    def window(self, load: Load, phase: str = "measure") -> Window:
        seconds, samples = run_streams(load, self._stream)
        return Window(self.name, self.baseline, load.concurrency, seconds, samples, phase,
                      api=self.api)

    def _stream(self, load: Load, stream: int, start: Callable[[], float]) -> list:
        import grpc

        from specdec.tls import open_channel
        from specdec.v1 import generate_pb2_grpc

        with open_channel(self.address, tls=self.tls) as channel:
            grpc.channel_ready_future(channel).result(timeout=self.connect_timeout_s)
            stub = generate_pb2_grpc.GeneratorStub(channel)
            t0 = start()
            out: list[LoadSample] = []
            while load.more(len(out), time.perf_counter() - t0):
                out.append(self._one(stub, load, stream, len(out), t0))
            return out

    def _one(self, stub, load: Load, stream: int, i: int, t0: float) -> LoadSample:
        import grpc

        from specdec_tools.bench.system import _request

        s = LoadSample(self.name, load.message(stream, i), 0, 0.0, concurrency=load.concurrency,
                       stream=stream, index=i, temperature=load.temperature)
        req = _request(s.prompt, load.max_new_tokens, self.k or 0, load.sampling(stream, i))
        if self.k is None:
            req.ClearField("num_draft_tokens")  # unset = the coordinator's default K
        sent = time.perf_counter()
        s.started = sent - t0
        try:
            for chunk in stub.GenerateStream(req, timeout=load.timeout):
                if chunk.token_ids:
                    s.chunk_times.append(time.perf_counter() - sent)
                    s.chunk_tokens.append(len(chunk.token_ids))
                    s.token_ids += chunk.token_ids
                    s.kinds += chunk.kinds
                s.text += chunk.text
                if chunk.finish_reason:
                    st = chunk.stats
                    s.rounds, s.drafted, s.accepted = (st.rounds, st.drafted_tokens,
                                                       st.accepted_tokens)
                    s.k_per_round = list(st.k_per_round)
                    s.mean_k, s.k_reason = st.mean_k, st.k_reason
        except grpc.RpcError as e:
            s.error = e.code().name
        s.seconds = time.perf_counter() - sent
        s.tokens = len(s.token_ids)
        s.ttft = s.chunk_times[0] if s.chunk_times else None
        return s


def run_levels(scenarios: Sequence, levels: Sequence[int], load_for: Callable[[int], Load],
               repeats: int = 1, *, reference: bool = True, failed: dict | None = None,
               desc: str = "load", say: Callable[[str], None] = print) -> list[Window]:
    """A warm-up request through every scenario (discarded); for a greedy run
    (`reference`) every prompt alone through each scenario that is its own baseline and
    names no other API's reference (the outputs every other window is checked against);
    then per concurrency level,
    `repeats` times, every scenario in turn. A scenario with a true `may_fail` (a peer)
    that raises is noted in `failed` (name -> error) and skipped from then on."""
    failed = {} if failed is None else failed
    windows: list[Window] = []

    def attempt(scenario, load: Load, phase: str) -> Window | None:
        if scenario.name in failed:
            return None
        try:
            window = scenario.window(load, phase)
        except Exception as exc:  # noqa: BLE001 - a peer's failure is a finding
            if not getattr(scenario, "may_fail", False):
                raise
            error = failed[scenario.name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            say(f"note: {scenario.name} failed and is skipped from now on: {error}")
            return None
        if phase != "warm-up":
            windows.append(window)
        return window

    alone = replace(load_for(1), requests_per_stream=1, duration_s=None)
    for scenario in scenarios:
        attempt(scenario, alone, "warm-up")
    if reference:
        every_prompt = replace(alone, requests_per_stream=len(alone.messages))
        for scenario in scenarios:
            if scenario.baseline is None and getattr(scenario, "reference_api", None) is None:
                attempt(scenario, every_prompt, "reference")
    jobs = [(n, sc) for n in levels for _ in range(repeats) for sc in scenarios]
    bar = tqdm(jobs, desc=desc, unit="window")
    for n, scenario in bar:
        api = getattr(scenario, "api", "")
        bar.set_postfix_str(f"N={n} {api} {scenario.name[:40]}")
        window = attempt(scenario, load_for(n), "measure")
        if window is not None and window.seconds:
            tokens = sum(s.tokens for s in window.samples)
            bar.write(f"  N={n:<3d} {api} {scenario.name}: {tokens / window.seconds:.1f} tok/s, "
                      f"{sum(s.error is not None for s in window.samples)} errors",
                      file=sys.stderr)
    return windows


def run(args: argparse.Namespace) -> int:
    from coordinator.loop.policy import DEFAULT_POLICY
    from specdec import stack
    from specdec.client_cli import stack_config
    from specdec.pair import placement
    from specdec_tools.bench import drain, load_peers, load_report
    from specdec_tools.bench.harness import comma_list as _list
    from specdec_tools.bench.harness import machine

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    levels = sorted({int(n) for n in _list(args.concurrency)})
    apis = list(dict.fromkeys(_list(args.api)))
    prompt_set = PROMPT_SETS[args.prompts]()
    messages = tuple(m for _, m in prompt_set)
    greedy = args.temperature == 0

    def load_for(n: int) -> Load:
        return Load(n, args.max_new_tokens, messages, args.requests_per_stream,
                    args.duration_s, args.temperature, args.timeout)

    setups = [] if args.peers == "none" else _list(args.peer_setups)
    if setups and args.target_model != "smollm2-135m":
        say(f"note: peers skipped: they run SmolLM2-135M's IRs, not {args.target_model}")
        setups = []
    cfg = stack_config(args)
    # Unset options are the coordinator's defaults (the stack does not pass them on).
    k = DEFAULT_POLICY.k if cfg.k is None else cfg.k
    pipelined = DEFAULT_POLICY.pipeline if cfg.pipeline is None else cfg.pipeline
    meta: dict = {"machine": machine(), "concurrency": levels,
                  "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                  "requests_per_stream": None if args.duration_s else args.requests_per_stream,
                  "duration_s": args.duration_s, "repeats": args.repeats,
                  "prompts": len(messages), "prompt_set": args.prompts, "apis": apis,
                  "command": " ".join(sys.argv),
                  "date": time.strftime("%Y-%m-%d"), "failed": {}}
    with ExitStack() as es:
        irs = {}
        if setups or (not args.address and args.target_model == "smollm2-135m"):
            from specdec.prepare import prepare_smollm2
            from specdec.runtime.openvino_export import export

            say("== preparing the model and its OpenVINO IRs (cached)")
            hf = prepare_smollm2()
            irs = dict(hf=str(hf), target_ir=str(export(hf, "fp32", say=say)),
                       draft_ir=str(export(hf, "int8", say=say)))
        cpus = placement(cfg.pin)
        ports: dict[str, int] = {}
        if not args.address:
            pair, ports = drain.with_metrics_ports(cfg.pair)
            cfg.pair = pair
            if cfg.http_port is None:  # not given: a free port (see add_parser)
                cfg.http_port = drain.free_port()
        tls = None
        if args.address:
            address, http_url = args.address, args.http_address
            meta["coordinator"] = f"given: {address}, HTTP {http_url or '-'}"
        else:
            say("== starting target, draft and coordinator (as `specdec up`)")
            running = stack.start(cfg, es, echo=args.verbose)
            address, http_url = running.address, running.http_url
            tls = running.client_tls
            meta["tls"] = "every hop (specdec up --tls)" if tls is not None else "off"
            processes = {name: p.proc.pid for name, p in (
                ("target", running.target), ("draft", running.draft),
                ("coordinator", running.coordinator)) if p is not None}
            if running.draft is None:
                ports.pop("draft")
            rss_start = drain.rss_of(processes)
            meta.update(coordinator=f"started here: default K={k}, "
                                    f"{'pipelined' if pipelined else 'sequential'} rounds",
                        target_args=cfg.pair.target.args(0, cpus["target"]),
                        draft_args=None if cfg.no_draft else cfg.pair.draft.args(0, cpus["draft"]))
        system = system_variants(apis, address, http_url, tls)
        options = dict(irs, k=k, precision="f32")
        windows: list[Window] = []
        # One pass per peer set-up, so only one set-up's peers hold models at a time; the
        # system's variants run in the first pass, beside the first set-up's peers.
        for i, setup in enumerate(setups or [None]):
            peers = [] if setup is None else load_peers.start(setup, cpus["target"], options, say)
            try:
                windows += run_levels((system if i == 0 else []) + peers, levels, load_for,
                                      args.repeats, reference=greedy, failed=meta["failed"],
                                      desc=f"load ({setup or 'no peers'})", say=say)
            finally:
                for peer in peers:
                    peer.close()
        if not args.address:  # the stack is still up: did every session go?
            meta["drain"] = drain.check(ports, processes, rss_start)
            say(" ".join(drain.lines(meta["drain"])))
    meta["peer_setups"] = {k: load_peers.SETUPS[k].label for k in setups}
    meta["peer_config"] = load_peers.CONFIG if setups else None
    rows = load_report.summarise(windows, greedy)
    out_dir = Path(args.out)
    md, files = load_report.write(rows, meta, out_dir)
    print(md)
    say("wrote " + ", ".join(str(f) for f in files))
    for p in load_report.findings(rows):
        say(f"peer not exact: {p}")
    problems = load_report.failures(rows)
    for p in problems:
        say(f"FAILURE: {p}")
    return 1 if problems else 0


def system_variants(apis: list[str], address: str, http_url: str | None, tls=None) -> list:
    """specdec load's loop variants, target-only and the coordinator's default K, through
    each API in `apis` order (gRPC at `address`, HTTP at `http_url`); the HTTP outputs
    are checked against the gRPC reference when gRPC runs too (listed first). `tls`: a
    specdec.tls.ClientTLS when the client API is TLS (its CA also verifies HTTPS)."""
    out: list = []
    for api in apis:
        if api == "grpc":
            out += [GrpcVariant(address, 0, BASELINE, tls=tls),
                    GrpcVariant(address, None, SPECULATIVE, BASELINE, tls=tls)]
        elif api == "http":
            ref = apis[0] if apis[0] != "http" else None
            ca = tls.ca if tls is not None else None
            out += [HttpVariant(http_url, 0, BASELINE, reference_api=ref, ca=ca),
                    HttpVariant(http_url, None, SPECULATIVE, BASELINE, reference_api=ref,
                                ca=ca)]
        else:
            raise ValueError(f"unknown api {api!r}")
    return out


def add_parser(sub) -> None:
    from specdec.client_cli import add_stack_flags
    from specdec_tools.bench.load_report import DEFINITIONS
    from specdec_tools.bench.peers import SETUPS

    p = sub.add_parser(
        "load", help="throughput and latency under N concurrent streams",
        description="Start the stack as `specdec up` does (or use --address) and, for each "
                    "concurrency N, drive N concurrent client streams (threads, each its own "
                    "closed loop of GenerateStream requests over the shipped prompt mix) "
                    "through the coordinator, for target-only (num_draft_tokens=0) and the "
                    "coordinator's default speculative loop (num_draft_tokens unset), "
                    "through its gRPC API and/or (--api) its HTTP API with SSE streaming, "
                    "interleaved per N, beside OpenVINO GenAI's continuous-batching pipeline "
                    "(plain and with the draft) on the same IRs in f32. Writes load.json, "
                    "load.md and PNG plots. Exit 1 on any failed request or, greedy, any "
                    "specdec output that differs from the same prompt generated alone by "
                    "target-only (a peer's differing outputs are reported, not failed).",
        epilog="Definitions: " + " ".join(DEFINITIONS.values()) + " Draft and target "
               "port 0 = a free port; the HTTP port, unless given, too.")
    p.add_argument("--concurrency", default="1,2,4,8,16,32",
                   help="concurrency levels N, comma-separated (default: %(default)s)")
    p.add_argument("--prompts", default="chat", choices=sorted(PROMPT_SETS),
                   help="the prompt mix: chat = general chat questions with nothing to copy "
                        "(specdec_tools.bench.chat_prompts, 16 prompts); bench = the shipped bench "
                        "set (specdec_tools.bench.prompts, 8 tasks, some with text to copy) "
                        "(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="tokens per request (default: %(default)s)")
    how_long = p.add_mutually_exclusive_group()
    how_long.add_argument("--requests-per-stream", type=int, default=2,
                          help="requests each stream sends per window (default: %(default)s)")
    how_long.add_argument("--duration-s", type=float, default=None,
                          help="instead: each stream sends requests until this many seconds "
                               "have passed in its window (the last one runs to its end)")
    p.add_argument("--repeats", type=int, default=1,
                   help="windows per (scenario, N), interleaved; pooled (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy, which also checks exactness (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="deadline of each request in seconds (default: %(default)s)")
    p.add_argument("--api", default="grpc",
                   help="client APIs, comma-separated, run interleaved: grpc = "
                        "Generator.GenerateStream; http = POST /v1/chat/completions with "
                        "stream=true (SSE) on the coordinator's HTTP API "
                        "(default: %(default)s)")
    p.add_argument("--address", metavar="HOST:PORT",
                   help="use a running coordinator instead of starting the stack (the stack "
                        "flags below are then ignored; --k still sets the GenAI peer's K)")
    p.add_argument("--http-address", metavar="HOST:PORT",
                   help="with --address and --api http: the running coordinator's HTTP "
                        "API (its --http-port); started here, the coordinator's is "
                        "--http-port, else a free port")
    p.add_argument("--peers", default="genai", choices=["genai", "none"],
                   help="genai = OpenVINO GenAI's continuous-batching pipeline, plain and "
                        "with the int8 draft, K = --k (SmolLM2-135M only); none = no peers "
                        "(default: %(default)s)")
    p.add_argument("--peer-setups", default=",".join(SETUPS),
                   help="set-ups the peers run in, comma-separated: " + "; ".join(
                       f"{k} = {s.label}" for k, s in SETUPS.items())
                   + " (default: %(default)s)")
    p.add_argument("--out", default="bench-results/load",
                   help="folder for load.json, load.md and the plots (default: %(default)s)")
    p.add_argument("--verbose", action="store_true", help="show the services' logs")
    add_stack_flags(p)
    p.set_defaults(draft_port=0, target_port=0, http_port=None)

    def main(args) -> int:
        unknown = [s for s in args.peer_setups.split(",") if s.strip() and s.strip() not in SETUPS]
        if unknown:
            p.error(f"unknown --peer-setups value(s): {', '.join(unknown)}; "
                    f"choose among {', '.join(SETUPS)}")
        apis = [a.strip() for a in args.api.split(",") if a.strip()]
        if not apis or set(apis) - set(APIS):
            p.error(f"--api takes a comma list of {', '.join(APIS)}, got {args.api!r}")
        if args.address and "http" in apis and not args.http_address:
            p.error("--api http with --address needs --http-address HOST:PORT")
        if not args.address and "http" in apis and args.http_port == 0:
            p.error("--api http needs the coordinator's HTTP API: no --http-port 0")
        return run(args)

    p.set_defaults(func=main)
