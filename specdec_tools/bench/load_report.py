"""What `specdec load` records and reports: the job of one measurement window (Load),
its records (LoadSample per request, Window), and the figures made from them: rows per
(api, scenario, concurrency), JSON, Markdown and PNG plots (the style of
specdec_tools.bench.report). The drivers are specdec_tools.bench.load (gRPC) and
specdec_tools.bench.load_http (HTTP/SSE); the GenAI peer, specdec_tools.bench.load_peers.

The load figures are not section 12's per-request speedup (docs/design.md): under load
the question is how many tokens the whole system delivers per second, and at what
latency, so the ratio here is of aggregate throughputs at the same concurrency.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from specdec.sampling import SamplingParams
from specdec_tools.bench import drain
from specdec_tools.bench.harness import Sample
from specdec_tools.bench.load_plots import plots
from specdec_tools.bench.report import _fmt, write_json

__all__ = ["DEFINITIONS", "Load", "LoadRow", "LoadSample", "Window", "failures", "load_json",
           "markdown", "percentile", "plots", "summarise", "write", "write_json"]


@dataclass
class LoadSample(Sample):
    """One request under load: harness.Sample (tokens, seconds = request latency, ttft,
    token ids, kinds, rounds, drafted, accepted) plus where and when it ran."""

    concurrency: int = 0
    stream: int = 0
    index: int = 0  # the stream's i-th request
    started: float = 0.0  # seconds from the window's start to the request being sent
    chunk_times: list[float] = field(default_factory=list)  # since sent, token chunks only
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each of those chunks
    k_per_round: list[int] = field(default_factory=list)  # from the final GenerationStats
    mean_k: float = 0.0  # ... the K chosen per round, on average
    k_reason: str = ""  # ... why K was 0 where it was
    error: str | None = None  # gRPC status code name (HTTP: the same), or a peer's status


@dataclass
class Window:
    """One scenario at one concurrency: its streams started together (or a warm-up or
    reference run, see specdec_tools.bench.load.run_levels)."""

    scenario: str
    baseline: str | None  # the scenario its throughput ratio and exactness compare with
    concurrency: int
    seconds: float  # from the streams' common start to the last answer
    samples: list[LoadSample]
    phase: str = "measure"  # or "reference": each prompt alone, for the exactness check
    api: str = ""  # DEFINITIONS["api"]: "grpc", "http"; "" = a peer, no client API
    reference_api: str | None = None  # whose reference windows to check with; None: api


@dataclass(frozen=True)
class Load:
    """What every stream of one window sends (picklable: peers get it in a child)."""

    concurrency: int
    max_new_tokens: int
    messages: tuple[str, ...]
    requests_per_stream: int = 1  # used when duration_s is None
    duration_s: float | None = None  # streams start requests until this much has passed
    temperature: float = 0.0
    timeout: float = 600.0  # per request
    presence_penalty: float = 0.0  # OpenAI's penalties, on every request
    frequency_penalty: float = 0.0

    def message(self, stream: int, i: int) -> str:
        return self.messages[(stream + i) % len(self.messages)]

    def sampling(self, stream: int, i: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, seed=1000 * stream + i,
                              presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty)

    def more(self, i: int, elapsed: float) -> bool:
        """Whether a stream that has sent `i` requests sends another."""
        if self.duration_s is None:
            return i < self.requests_per_stream
        return i == 0 or elapsed < self.duration_s

    def window_timeout(self) -> float:
        """The longest a window can take, plus a minute."""
        if self.duration_s is not None:
            return self.duration_s + self.timeout + 60.0
        return self.requests_per_stream * self.timeout + 60.0


DEFINITIONS = {
    "aggregate": "aggregate tok/s = the steady-state throughput of a (scenario, N) window: "
                 "the tokens that arrived while every stream was active, over that "
                 "interval. It runs from t_lo, the latest of the streams' first "
                 "token-carrying chunks (every stream is producing), to t_hi, the earliest "
                 "of the streams' ends of their last requests (none has stopped yet); every "
                 "token-carrying chunk of every request (a failed one's too) whose arrival "
                 "(its request's send time plus the chunk's time since, from the window's "
                 "start) lies in (t_lo, t_hi] counts with its tokens (the chunk at t_lo was "
                 "made before the interval). Repeats pooled: the "
                 "tokens summed over the intervals summed. A window with no such interval "
                 "(t_hi <= t_lo: e.g. one request per stream, all over before the last "
                 "stream's first token, or a stream without a token) counts with its wall "
                 "figure instead (noted below the table). The ramp and the tail are left "
                 "out.",
    "wall": "wall tok/s = every token the clients received in a window (a failed "
            "request's too) divided by its wall time, from the streams' common start to "
            "the last answer (repeats pooled): ramp and tail included.",
    "throughput_ratio": "throughput ratio = a loop's aggregate (steady-state) tok/s "
                        "divided by its baseline's at the same concurrency in the same run "
                        "(specdec: target-only, K=0, through the same system; a GenAI peer: "
                        "the same pipeline without its draft); not the per-request speedup "
                        "of docs/design.md section 12.",
    "stream": "per-stream tok/s = a stream's tokens over the time from its first request "
              "sent to its last answer; the median over streams.",
    "itl": "inter-token latency (ITL) = the gap between consecutive token-carrying "
           "chunks of a request divided by the tokens in the later chunk, counted once "
           "per token (a speculative round streams several tokens in one chunk); TTFT = "
           "request sent to its first token-carrying chunk, per successful request.",
    "tpot": "time per output token (TPOT) = a request's decode time over the tokens after "
            "its first: (latency - TTFT) / (tokens - 1), latency = request sent to its "
            "last chunk, one value per successful request with at least 2 tokens (ITL "
            "counts once per token, TPOT once per request).",
    "icl": "inter-chunk latency = the gap between consecutive content-carrying chunks "
           "of a request (a gRPC chunk or an SSE event with token ids), not divided by "
           "their tokens, counted once per gap: the ITL when each chunk is one token "
           "(target-only), the time between rounds for a speculative loop.",
    "api": "api = the client API: grpc = Generator.GenerateStream; http = POST "
           "/v1/chat/completions with stream=true, server-sent events; the same requests; "
           "- = a peer. Greedy outputs of both are checked against one reference (each "
           "prompt alone, target-only, through the first api).",
}


@dataclass
class LoadRow:
    scenario: str  # the loop variant (or peer); `api` says how it was reached
    concurrency: int
    baseline: str | None
    requests: int
    tokens: int
    seconds: float  # the windows' wall time
    aggregate_tps: float  # DEFINITIONS["aggregate"], steady state
    throughput_ratio: float | None  # DEFINITIONS["throughput_ratio"]
    stream_tps_median: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    latency_p50_ms: float | None  # whole request, sent to last chunk
    errors: dict[str, int] = field(default_factory=dict)  # status code name -> count
    rounds: int = 0  # from the final chunks' GenerationStats
    mean_k: float | None = None  # mean K per round
    acceptance: float | None = None  # accepted / drafted tokens
    tokens_per_round: float | None = None
    compared: int = 0  # greedy outputs checked against the same prompt alone
    mismatches: int | None = None  # of those, how many differ (None: not checked)
    icl_p50_ms: float | None = None  # DEFINITIONS["icl"]
    icl_p95_ms: float | None = None
    api: str = ""  # DEFINITIONS["api"]; "" = a peer
    wall_tps: float | None = None  # DEFINITIONS["wall"]
    steady_seconds: float = 0.0  # the steady intervals summed (a fallback's: its wall time)
    steady_fallbacks: int = 0  # windows without a steady interval, counted at wall time
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None  # DEFINITIONS["tpot"]
    tpot_p99_ms: float | None = None

    @property
    def label(self) -> str:
        """Its line in plots and messages: the api and scenario (a peer: the scenario)."""
        return f"{self.api}: {self.scenario}" if self.api else self.scenario


def percentile(xs, q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default);
    None for no values."""
    xs = sorted(xs)
    if not xs:
        return None
    rank = (len(xs) - 1) * q / 100
    lo = int(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def inter_token_latencies(s: LoadSample) -> list[float]:
    """DEFINITIONS["itl"]: seconds per token between a request's token chunks."""
    out = []
    for prev, cur, n in zip(s.chunk_times, s.chunk_times[1:], s.chunk_tokens[1:],
                            strict=False):
        out += [(cur - prev) / n] * n
    return out


def inter_chunk_latencies(s: LoadSample) -> list[float]:
    """DEFINITIONS["icl"]: seconds between a request's consecutive token chunks."""
    return [cur - prev for prev, cur in zip(s.chunk_times, s.chunk_times[1:], strict=False)]


def time_per_output_token(s: LoadSample) -> float:
    """DEFINITIONS["tpot"] of a request with a first token and at least 2 tokens."""
    return (s.seconds - s.ttft) / (s.tokens - 1)


def steady_state(w: Window) -> tuple[int, float] | None:
    """DEFINITIONS["aggregate"] of one window: (the tokens that arrived in (t_lo, t_hi],
    t_hi - t_lo), times from the window's start; None without such an interval. The
    chunk that arrives at t_lo is not counted: it was made before the interval."""
    first: dict[int, float] = {}  # stream -> its first token-carrying chunk's arrival
    end: dict[int, float] = {}  # stream -> the end of its last request
    for s in w.samples:
        if s.chunk_times:
            arrival = s.started + s.chunk_times[0]
            first[s.stream] = min(first.get(s.stream, arrival), arrival)
        end[s.stream] = max(end.get(s.stream, 0.0), s.started + s.seconds)
    if not first or len(first) < max(len(end), w.concurrency):  # a stream with no token
        return None
    t_lo, t_hi = max(first.values()), min(end.values())
    if t_hi <= t_lo:
        return None
    tokens = sum(n for s in w.samples
                 for t, n in zip(s.chunk_times, s.chunk_tokens, strict=False)
                 if t_lo < s.started + t <= t_hi)
    return tokens, t_hi - t_lo


def stream_rates(w: Window) -> list[float]:
    """DEFINITIONS["stream"], one value per stream of the window."""
    by_stream: dict[int, list[LoadSample]] = defaultdict(list)
    for s in w.samples:
        by_stream[s.stream].append(s)
    out = []
    for group in by_stream.values():
        span = max(s.started + s.seconds for s in group) - min(s.started for s in group)
        if span > 0:
            out.append(sum(s.tokens for s in group) / span)
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else 1000 * x


def _references(windows: list[Window]) -> dict[tuple[str, str, str], list[int]]:
    """(api, scenario, prompt) -> the token ids of that prompt generated alone."""
    refs: dict[tuple[str, str, str], list[int]] = {}
    for w in windows:
        if w.phase == "reference":
            for s in w.samples:
                if s.error is None:
                    refs.setdefault((w.api, w.scenario, s.prompt), list(s.token_ids))
    return refs


def summarise(windows: list[Window], greedy: bool = True) -> list[LoadRow]:
    """One row per (api, scenario, concurrency) of the measurement windows, in run
    order. Greedy: every output is compared with the same prompt generated alone (the
    reference windows) by the row's baseline, or by the scenario itself without one,
    through the window's reference_api (else its api)."""
    groups: dict[tuple[str, str, int], list[Window]] = defaultdict(list)
    for w in windows:
        if w.phase == "measure":
            groups[(w.api, w.scenario, w.concurrency)].append(w)
    refs = _references(windows)
    rows = [_row(ws, refs if greedy else None) for ws in groups.values()]
    aggregate = {(r.api, r.scenario, r.concurrency): r.aggregate_tps for r in rows}
    for r in rows:
        base = aggregate.get((r.api, r.baseline, r.concurrency)) if r.baseline else None
        r.throughput_ratio = r.aggregate_tps / base if base else None
    return rows


def _row(ws: list[Window], refs: dict | None) -> LoadRow:
    w0 = ws[0]
    samples = [s for w in ws for s in w.samples]
    ok = [s for s in samples if s.error is None]
    tokens, seconds = sum(s.tokens for s in samples), sum(w.seconds for w in ws)
    ttft = [s.ttft for s in ok if s.ttft is not None]
    itl = [x for s in ok for x in inter_token_latencies(s)]
    icl = [x for s in ok for x in inter_chunk_latencies(s)]
    rates = [x for w in ws for x in stream_rates(w)]
    tpot = [time_per_output_token(s) for s in ok if s.tokens >= 2 and s.ttft is not None]
    steady = [steady_state(w) for w in ws]
    counted = [st or (sum(s.tokens for s in w.samples), w.seconds)  # a fallback: wall
               for w, st in zip(ws, steady, strict=True)]
    steady_tokens, steady_seconds = sum(n for n, _ in counted), sum(t for _, t in counted)
    row = LoadRow(w0.scenario, w0.concurrency, w0.baseline, len(samples), tokens, seconds,
                  steady_tokens / steady_seconds if steady_seconds else 0.0, None,
                  statistics.median(rates) if rates else None,
                  _ms(percentile(ttft, 50)), _ms(percentile(ttft, 95)),
                  _ms(percentile(itl, 50)), _ms(percentile(itl, 95)),
                  _ms(percentile([s.seconds for s in ok], 50)),
                  dict(Counter(s.error for s in samples if s.error is not None)),
                  icl_p50_ms=_ms(percentile(icl, 50)), icl_p95_ms=_ms(percentile(icl, 95)),
                  api=w0.api, wall_tps=tokens / seconds if seconds else 0.0,
                  steady_seconds=steady_seconds, steady_fallbacks=steady.count(None),
                  ttft_p99_ms=_ms(percentile(ttft, 99)), tpot_p50_ms=_ms(percentile(tpot, 50)),
                  tpot_p99_ms=_ms(percentile(tpot, 99)))
    row.rounds = sum(s.rounds for s in ok)
    ks = [k for s in ok for k in s.k_per_round]
    drafted = sum(s.drafted for s in ok)
    if row.rounds:
        row.mean_k = statistics.mean(ks) if ks else drafted / row.rounds
        row.tokens_per_round = sum(s.tokens for s in ok) / row.rounds
    row.acceptance = sum(s.accepted for s in ok) / drafted if drafted else None
    if refs is not None:
        ref = (w0.reference_api or w0.api, w0.baseline or w0.scenario)
        checked = [s for s in ok if (*ref, s.prompt) in refs]
        row.compared = len(checked)
        row.mismatches = sum(s.token_ids != refs[(*ref, s.prompt)] for s in checked)
    return row


def table(rows: list[LoadRow]) -> list[str]:
    """The Markdown table, by concurrency then (api, scenario) in run order."""
    out = ["| N | api | scenario | requests | aggregate tok/s | wall tok/s "
           "| throughput ratio | per-stream tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
           "| ITL p50 / p95 ms | inter-chunk p50 / p95 ms | latency p50 ms | mean K "
           "| acceptance | errors | exact |", "|" + "---|" * 17]
    order = {k: i for i, k in enumerate(dict.fromkeys((r.api, r.scenario) for r in rows))}
    for r in sorted(rows, key=lambda r: (r.concurrency, order[(r.api, r.scenario)])):
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "0"
        exact = "-" if r.mismatches is None or not r.compared else (
            f"yes ({r.compared})" if not r.mismatches else f"NO ({r.mismatches}/{r.compared})")
        out.append(
            f"| {r.concurrency} | {r.api or '-'} | {r.scenario} | {r.requests} | "
            f"{r.aggregate_tps:.1f} | {_fmt(r.wall_tps, '.1f')} | "
            f"{_fmt(r.throughput_ratio, '.2f', 'x')} | {_fmt(r.stream_tps_median, '.1f')} | "
            f"{_fmt(r.ttft_p50_ms, '.0f')} / {_fmt(r.ttft_p99_ms, '.0f')} | "
            f"{_fmt(r.tpot_p50_ms, '.1f')} / {_fmt(r.tpot_p99_ms, '.1f')} | "
            f"{_fmt(r.itl_p50_ms, '.1f')} / {_fmt(r.itl_p95_ms, '.1f')} | "
            f"{_fmt(r.icl_p50_ms, '.1f')} / {_fmt(r.icl_p95_ms, '.1f')} | "
            f"{_fmt(r.latency_p50_ms, '.0f')} | {_fmt(r.mean_k)} | {_fmt(r.acceptance)} | "
            f"{errors} | {exact} |")
    return out


def markdown(rows: list[LoadRow], meta: dict) -> str:
    how_long = (f"{meta['duration_s']} s per window" if meta.get("duration_s")
                else f"{meta.get('requests_per_stream')} requests per stream")
    out = [f"Machine: {meta.get('machine', '?')}. Coordinator: {meta.get('coordinator', '?')}. "
           f"{meta.get('prompts')} prompts, {meta.get('max_new_tokens')} new tokens, "
           f"temperature {meta.get('temperature')}, {how_long}, {meta.get('repeats')} "
           "window(s) per (api, scenario, N), interleaved.", ""]
    out += [f"- {d}" for d in DEFINITIONS.values()]
    out += [""] + table(rows) + [""]
    out += [f"Steady state: {r.label} N={r.concurrency}: {r.steady_fallbacks} window(s) "
            "had no interval with every stream active; counted at wall time."
            for r in rows if r.steady_fallbacks]
    out += [f"Peers: {meta['peer_config']}."] if meta.get("peer_config") else []
    out += [f"Peer set-up {k}: {v}" for k, v in (meta.get("peer_setups") or {}).items()]
    out += [f"Failed and skipped: {k}: {v}" for k, v in (meta.get("failed") or {}).items()]
    out += drain.lines(meta.get("drain"))
    return "\n".join(out) + "\n"


def load_json(path: Path) -> tuple[list[LoadRow], dict]:
    """(rows, meta) of a load.json. A file from before the steady-state figure lacks the
    newer fields (defaults); its aggregate_tps is the wall figure, so wall_tps takes it."""
    data = json.loads(Path(path).read_text())
    rows = [LoadRow(**{"wall_tps": r["aggregate_tps"], **r}) for r in data["rows"]]
    return rows, data["meta"]


def failures(rows: list[LoadRow]) -> list[str]:
    """What makes `specdec load` exit 1: failed requests, and greedy outputs of specdec's
    own rows that differ from the same prompt generated alone (a peer's are `findings`)."""
    out = [f"{r.label} N={r.concurrency}: {sum(r.errors.values())} failed requests "
           f"{r.errors}" for r in rows if r.errors]
    return out + [_mismatch(r) for r in rows if r.mismatches and r.api]


def findings(rows: list[LoadRow]) -> list[str]:
    """What a peer got wrong: reported, not a failure of this run."""
    return [_mismatch(r) for r in rows if r.mismatches and not r.api]


def _mismatch(r: LoadRow) -> str:
    return (f"{r.label} N={r.concurrency}: {r.mismatches} of {r.compared} greedy "
            "outputs differ from the same prompt's alone")


def write(rows: list[LoadRow], meta: dict, out_dir: Path) -> tuple[str, list[Path]]:
    """load.md, load.json and the plots into out_dir; (the Markdown, the files)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(rows, meta)
    (out_dir / "load.md").write_text(md)
    write_json(out_dir / "load.json", rows, meta)
    return md, [out_dir / "load.md", out_dir / "load.json", *plots(rows, out_dir)]
