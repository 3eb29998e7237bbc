"""The soak's traffic: a seeded mix of requests, their greedy references, and the client
streams that send them through the coordinator (specdec.client), each a closed loop.

The mix: chat prompts from specdec_tools.bench.prompts; greedy and sampled (temperature 0.8,
sometimes top-p or top-k, a fresh seed each) requests; max_new_tokens drawn from
`lengths`; K left to the server (load-aware), or 0, 2 or 4; stop strings on some; and
some streams cancelled on purpose after their first chunk(s) (the client closes the
stream, which cancels the RPC).

Greedy requests come from a fixed catalogue, each referenced once before the run by
target-only greedy decoding (num_draft_tokens = 0) on the same services. Half the
catalogue has a stop string taken from the middle of its own reference text, so the stop
really fires; sampled requests use the commonest two characters of the reference texts.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from specdec.client import Client, SpecdecAPIError
from specdec_tools.bench.prompts import PROMPTS

log = logging.getLogger("specdec_tools.soak.cli")

MESSAGES = [m for _, m in PROMPTS]
K_CHOICES = (None, None, 0, 2, 4)  # None = the coordinator's default (load-aware) K
FINISH_REASONS = ("length", "eos", "stop")


@dataclass(frozen=True)
class Spec:
    """One request."""

    kind: str  # "greedy" | "sampled"
    prompt: int  # index into MESSAGES
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    k: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    cancel_after: int | None = None  # close the stream after this many chunks

    @property
    def key(self) -> tuple:
        """What the greedy output depends on (not K, not the cancellation)."""
        return (self.prompt, self.max_new_tokens, self.stop)

    def options(self) -> dict:
        return dict(messages=[("user", MESSAGES[self.prompt])],
                    max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                    top_p=self.top_p, top_k=self.top_k, seed=self.seed, stop=self.stop,
                    num_draft_tokens=self.k)


@dataclass
class Outcome:
    """What one request got."""

    spec: Spec
    stream: int
    started_s: float
    ended_s: float = 0.0
    status: str = "completed"  # "completed" | "cancelled" | "failed"
    code: str | None = None
    message: str = ""
    token_ids: list[int] = field(default_factory=list)
    kinds: list = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)
    text: str = ""
    chunks: int = 0
    finish_reason: str | None = None
    generated_stat: int | None = None


def run_one(client: Client, spec: Spec, stream: int, clock: Callable[[], float],
            timeout: float) -> Outcome:
    out = Outcome(spec, stream, clock())
    chunks = client.stream(timeout=timeout, **spec.options())
    try:
        for chunk in chunks:
            out.chunks += 1
            out.token_ids += chunk.token_ids
            out.kinds += chunk.kinds
            out.token_texts += chunk.token_texts
            out.text += chunk.text
            if chunk.finish_reason:
                out.finish_reason = chunk.finish_reason
                out.generated_stat = chunk.stats.generated_tokens
            elif spec.cancel_after is not None and out.chunks >= spec.cancel_after:
                chunks.close()  # on purpose: the RPC is cancelled, the server must clean up
                out.status = "cancelled"
                break
    except SpecdecAPIError as e:
        out.status, out.code, out.message = "failed", e.status_name, e.message
    finally:
        chunks.close()
        out.ended_s = clock()
    return out


def well_formed(out: Outcome) -> str | None:
    """None when a completed output is consistent, else what is wrong."""
    n, spec = len(out.token_ids), out.spec
    if out.finish_reason not in FINISH_REASONS:
        return f"finish_reason {out.finish_reason!r}"
    if not (n == len(out.kinds) == len(out.token_texts)):
        return f"{n} ids, {len(out.kinds)} kinds, {len(out.token_texts)} token texts"
    if "".join(out.token_texts) != out.text:
        return "token texts do not join to the text"
    if not 1 <= n <= spec.max_new_tokens:
        return f"{n} tokens for max_new_tokens {spec.max_new_tokens}"
    if out.finish_reason == "length" and n != spec.max_new_tokens:
        return f"finish 'length' after {n} of {spec.max_new_tokens} tokens"
    if out.generated_stat != n:
        return f"stats.generated_tokens {out.generated_stat} for {n} tokens"
    if any(s in out.text for s in spec.stop):
        return "a stop string is left in the text"
    if out.finish_reason == "stop" and not spec.stop:
        return "finish 'stop' without a stop string"
    return None


def matches(out: Outcome, ref: Outcome) -> str | None:
    """None when a completed greedy output equals its target-only reference: same text,
    same finish reason, same token ids (after a stop string the output may carry the rest
    of the round that completed it: ids past the reference's are not compared)."""
    if out.finish_reason != ref.finish_reason:
        return f"finish {out.finish_reason!r}, reference {ref.finish_reason!r}"
    if out.text != ref.text:
        return f"text {out.text[:60]!r}..., reference {ref.text[:60]!r}..."
    ids, want = out.token_ids, ref.token_ids
    if ref.finish_reason == "stop":
        ids = ids[:len(want)]
    if ids != want:
        first = next((i for i, (a, b) in enumerate(zip(ids, want, strict=False)) if a != b),
                     min(len(ids), len(want)))
        return (f"token ids differ from position {first} ({len(out.token_ids)} ids, "
                f"reference {len(want)})")
    return None


class Mix:
    """The seeded request mix and its greedy catalogue."""

    def __init__(self, lengths: list[int], seed: int, greedy_fraction: float,
                 cancel_fraction: float, stop_fraction: float, catalogue: int):
        self.lengths, self.seed = lengths, seed
        self.greedy_fraction, self.cancel_fraction = greedy_fraction, cancel_fraction
        self.stop_fraction = stop_fraction
        rng = random.Random(seed)
        self.base = [Spec("greedy", i % len(MESSAGES), lengths[rng.randrange(len(lengths))])
                     for i in range(catalogue)]
        self.greedy: list[Spec] = []
        self.references: dict[tuple, Outcome] = {}
        self.sampled_stop: tuple[str, ...] = ()

    def reference(self, address: str, timeout: float, workers: int = 4,
                  say: Callable[[str], None] = log.info) -> None:
        """Target-only greedy references: the catalogue, then its stop variants."""
        t0 = time.monotonic()
        self._refer(address, self.base, timeout, workers)
        stops = []
        for spec in self.base[::2]:  # every second entry also with a stop string
            stop = stop_string(self.references[spec.key].text)
            if stop:
                stops.append(Spec("greedy", spec.prompt, spec.max_new_tokens, (stop,)))
        self._refer(address, stops, timeout, workers)
        self.greedy = self.base + stops
        texts = "".join(r.text for r in self.references.values())
        pairs = Counter(texts[i:i + 2] for i in range(len(texts) - 1)
                        if texts[i:i + 2].strip() == texts[i:i + 2])
        self.sampled_stop = (pairs.most_common(1)[0][0],) if pairs else ()
        fired = sum(self.references[s.key].finish_reason == "stop" for s in stops)
        say(f"references: {len(self.references)} target-only greedy generations in "
            f"{time.monotonic() - t0:.1f} s ({len(stops)} with a stop string, {fired} of "
            f"them stopped by it); sampled stop string {self.sampled_stop!r}")

    def _refer(self, address: str, specs: list[Spec], timeout: float, workers: int) -> None:
        def one(spec: Spec) -> Outcome:
            with Client(address, timeout=timeout) as client:
                return run_one(client, replace(spec, k=0), -1, time.monotonic, timeout)

        with ThreadPoolExecutor(workers) as pool:
            for spec, ref in zip(specs, pool.map(one, specs), strict=True):
                if ref.status != "completed" or well_formed(ref):
                    raise RuntimeError(f"reference for {spec} failed before any fault: "
                                       f"{ref.code} {ref.message} {well_formed(ref) or ''}")
                self.references[spec.key] = ref

    def next(self, rng: random.Random) -> Spec:
        cancel = rng.randint(1, 3) if rng.random() < self.cancel_fraction else None
        k = rng.choice(K_CHOICES)
        if rng.random() < self.greedy_fraction:
            base = rng.choice(self.greedy)
            return Spec("greedy", base.prompt, base.max_new_tokens, base.stop, k=k,
                        cancel_after=cancel)
        stop = self.sampled_stop if rng.random() < self.stop_fraction else ()
        top_p, top_k = rng.choice([(None, None), (0.95, None), (None, 50)])
        return Spec("sampled", rng.randrange(len(MESSAGES)), rng.choice(self.lengths), stop,
                    k=k, temperature=0.8, top_p=top_p, top_k=top_k,
                    seed=rng.randrange(1, 2**31), cancel_after=cancel)


def stop_string(text: str) -> str | None:
    """Three characters from the middle of `text` with no space at either end."""
    for start in range(len(text) // 2, len(text) - 2):
        piece = text[start:start + 3]
        if piece == piece.strip() and piece.isprintable():
            return piece
    return None


class Streams:
    """`n` client streams, each a thread sending one request after another until the run
    is `duration_s` old (the last request runs to its end). After an UNAVAILABLE or
    RESOURCE_EXHAUSTED a stream waits `backoff_s` before its next request."""

    def __init__(self, address: str, mix: Mix, n: int, duration_s: float, timeout: float,
                 backoff_s: float = 0.5):
        self.address, self.mix, self.n = address, mix, n
        self.duration_s, self.timeout, self.backoff_s = duration_s, timeout, backoff_s
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.t0 = 0.0

    def clock(self) -> float:
        return time.monotonic() - self.t0

    def start(self, t0: float) -> None:
        self.t0 = t0
        for s in range(self.n):
            t = threading.Thread(target=self._stream, args=(s,), name=f"soak-{s}", daemon=True)
            t.start()
            self._threads.append(t)

    def _stream(self, s: int) -> None:
        rng = random.Random(self.mix.seed * 1000 + s)
        with Client(self.address, timeout=self.timeout) as client:
            while self.clock() < self.duration_s:
                out = run_one(client, self.mix.next(rng), s, self.clock, self.timeout)
                with self._lock:
                    self.outcomes.append(out)
                if out.code in ("UNAVAILABLE", "RESOURCE_EXHAUSTED"):
                    time.sleep(self.backoff_s)

    def running(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return self.running() == 0

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)
