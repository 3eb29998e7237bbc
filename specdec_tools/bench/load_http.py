"""`specdec load`'s client streams: the thread runner every driver shares (run_streams:
N streams, a common start, their samples) and the HTTP driver (`--api http`): the same
closed-loop streams as specdec_tools.bench.load.GrpcVariant's, through the coordinator's
OpenAI-compatible HTTP API, POST /v1/chat/completions with stream=true, read as
server-sent events.

Each stream is a thread with its own httpx.Client (one keep-alive connection, as a gRPC
stream has its own channel) and sends what specdec_tools.bench.load.GrpcVariant sends: the
prompt mix's chat message as one user message, max_tokens, temperature and seed from
the Load, num_draft_tokens 0 (target-only) or absent (the coordinator's default K:
"unset = server default" as in generate.proto), and the request's timeout.
stream_options.include_usage asks for the final usage chunk, whose `usage.specdec`
carries the GenerationStats (rounds, drafted and accepted tokens, K per round).

A chunk is one `data: {json}` event; it carries content when its `specdec.token_ids`
is not empty (those are the round's tokens: the count per chunk comes from there, not
from the text). Its time is when the client has read and parsed the event, the clock
GrpcVariant keeps for a GenerateChunk. The stream ends at `data: [DONE]`. A request the
server refuses (4xx/5xx before the stream starts) or an `{"error": ...}` event inside
the stream is recorded as the error's code in upper case, which is the gRPC status
name for specdec's errors (coordinator.api.openai_api), else HTTP_<status>.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from specdec_tools.bench.load_report import Load, LoadSample, Window

CHAT_PATH = "/v1/chat/completions"
DATA = "data: "


def run_streams(load: Load, stream: Callable[[Load, int, Callable[[], float]], list]
                ) -> tuple[float, list[LoadSample]]:
    """`load.concurrency` threads, each running `stream(load, index, start)`: it connects,
    then calls `start()`, which returns once every stream is connected, with the window's
    common start (time.perf_counter()), and returns its samples. Returns (the window's
    seconds, from that start to the last answer; all samples)."""
    n = load.concurrency
    t0: list[float] = []
    barrier = threading.Barrier(n, action=lambda: t0.append(time.perf_counter()))
    results: list[list[LoadSample]] = [[] for _ in range(n)]
    failures: list[BaseException] = []

    def start() -> float:
        barrier.wait()
        return t0[0]

    def work(i: int) -> None:
        try:
            results[i] = stream(load, i, start)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    samples = [s for r in results for s in r]
    return max((s.started + s.seconds for s in samples), default=0.0), samples


def _kind(name: str) -> int:
    """'accepted' -> generate_pb2.TOKEN_KIND_ACCEPTED (the gRPC chunk's value)."""
    from specdec.v1 import generate_pb2

    try:
        return generate_pb2.TokenKind.Value(f"TOKEN_KIND_{name.upper()}")
    except ValueError:
        return generate_pb2.TOKEN_KIND_UNSPECIFIED


def _error_code(body) -> str | None:
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return None
    return str(err.get("code") or err.get("type") or "error").upper()


class HttpVariant:
    """One loop variant through the coordinator's HTTP API at `base_url`: `k` 0 =
    target-only, None = the coordinator's default K (num_draft_tokens left out).
    `reference_api` names the API whose reference windows its greedy outputs are
    checked against (None: its own; "grpc" when the gRPC scenarios run too)."""

    api = "http"
    may_fail = False
    connect_timeout_s = 60.0

    def __init__(self, base_url: str, k: int | None, name: str, baseline: str | None = None,
                 reference_api: str | None = None, ca: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.ca = ca  # verify an HTTPS API against this CA bundle (None: the system's)
        if "://" not in self.base_url:
            self.base_url = f"http://{self.base_url}"
        self.k, self.name, self.baseline = k, name, baseline
        self.reference_api = reference_api
        self._model: str | None = None
        # httpx logs every request at INFO, which `specdec` turns on: thousands of lines.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    def window(self, load: Load, phase: str = "measure") -> Window:
        seconds, samples = run_streams(load, self._stream)
        return Window(self.name, self.baseline, load.concurrency, seconds, samples, phase,
                      api=self.api, reference_api=self.reference_api)

    def model(self, client) -> str:
        """The id GET /v1/models lists (what requests send as `model`)."""
        if self._model is None:
            r = client.get("/v1/models")
            r.raise_for_status()
            self._model = r.json()["data"][0]["id"]
        return self._model

    def _client(self, load: Load):
        import ssl

        import httpx

        verify = ssl.create_default_context(cafile=self.ca) if self.ca else True
        # trust_env=False: no proxy from the environment between the bench and loopback.
        return httpx.Client(base_url=self.base_url, trust_env=False, verify=verify,
                            timeout=httpx.Timeout(load.timeout, connect=self.connect_timeout_s))

    def _stream(self, load: Load, stream: int, start: Callable[[], float]) -> list:
        with self._client(load) as client:
            model = self.model(client)  # connected (keep-alive) before the common start
            t0 = start()
            out: list[LoadSample] = []
            while load.more(len(out), time.perf_counter() - t0):
                out.append(self._one(client, model, load, stream, len(out), t0))
            return out

    def body(self, model: str, load: Load, stream: int, i: int) -> dict:
        sampling = load.sampling(stream, i)
        body = {"model": model, "messages": [{"role": "user",
                                              "content": load.message(stream, i)}],
                "max_tokens": load.max_new_tokens, "temperature": sampling.temperature,
                "seed": sampling.seed, "stream": True,
                "stream_options": {"include_usage": True}, "timeout": load.timeout}
        if self.k is not None:  # absent = the coordinator's default K
            body["num_draft_tokens"] = self.k
        return body

    def _one(self, client, model: str, load: Load, stream: int, i: int,
             t0: float) -> LoadSample:
        import httpx

        s = LoadSample(self.name, load.message(stream, i), 0, 0.0,
                       concurrency=load.concurrency, stream=stream, index=i,
                       temperature=load.temperature)
        body = self.body(model, load, stream, i)
        sent = time.perf_counter()
        s.started = sent - t0
        try:
            with client.stream("POST", CHAT_PATH, json=body) as r:
                if r.status_code != 200:
                    r.read()
                    try:
                        s.error = _error_code(r.json())
                    except ValueError:
                        pass
                    s.error = s.error or f"HTTP_{r.status_code}"
                else:
                    self._read(r.iter_lines(), s, sent)
        except httpx.HTTPError as exc:
            s.error = s.error or type(exc).__name__.upper()
        s.seconds = time.perf_counter() - sent
        s.tokens = len(s.token_ids)
        s.ttft = s.chunk_times[0] if s.chunk_times else None
        return s

    @staticmethod
    def _read(lines, s: LoadSample, sent: float) -> None:
        """The SSE events of one response into `s` (see the module docstring)."""
        done = False
        for line in lines:
            if not line.startswith(DATA):
                continue  # the blank line between events (and any SSE comment)
            data = line[len(DATA):]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            code = _error_code(event)
            if code is not None:
                s.error = code
                continue
            ids = (event.get("specdec") or {}).get("token_ids") or []
            if ids:
                s.chunk_times.append(time.perf_counter() - sent)
                s.chunk_tokens.append(len(ids))
                s.token_ids += ids
                s.kinds += [_kind(k) for k in event["specdec"].get("kinds", [])]
            for choice in event.get("choices") or []:
                s.text += (choice.get("delta") or {}).get("content") or ""
            stats = (event.get("usage") or {}).get("specdec")
            if stats:
                s.rounds, s.drafted, s.accepted = (stats["rounds"], stats["drafted_tokens"],
                                                   stats["accepted_tokens"])
                s.k_per_round = list(stats.get("k_per_round") or [])
        if not done and s.error is None:
            s.error = "INCOMPLETE_STREAM"  # the connection ended without [DONE]

