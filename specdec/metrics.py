"""Prometheus metrics of the model services and the coordinator (`--metrics-port`).

Off by default (`--metrics-port 0`): engines, the session store's owner and the loop
then hold the null objects `ModelMetrics` / `LoopMetrics`, whose methods do nothing, so
code that builds engines or loops directly (tests, benchmarks) needs no registry. On,
each process gets its own CollectorRegistry (never prometheus_client's global one:
several services can share a test process) served as Prometheus text at
http://HOST:PORT/metrics.

Names: prefix `specdec_`, then the part (`draft_`, `target_`, `coordinator_`; the
acceptance counters use vLLM's `spec_decode_` names), base units in the name
(`_seconds`), `_total` on counters.

Model services (`specdec_draft_*`; the target's are the same with `specdec_target_`):
  live_sessions                      gauge      sessions (KV caches) held now
  busy_sessions                      gauge      sessions a request is using now
  cached_tokens                      gauge      KV positions held or reserved, all sessions
  session_evictions_total{reason}    counter    reason=idle (TTL) | memory (KV budget)
  released_sessions_total            counter    sessions freed by Release
  forward_duration_seconds           histogram  one forward pass of the scheduler
  tokens_fed_total                   counter    tokens fed through the model
  batch_sessions                     histogram  sessions (requests) per forward pass
  batch_tokens                       histogram  tokens per forward pass
  queue_wait_seconds                 histogram  a step's wait for its forward pass
Paged OpenVINO with its prefix cache (`track_prefix_cache`; specdec.runtime.prefix_cache):
  prefix_cache_lookups_total         counter    session passes that could be served blocks
  prefix_cache_hits_total            counter    of them, those served at least one block
  prefix_cache_hit_tokens_total      counter    fed tokens served from the cache (saved)
  prefix_cache_blocks                gauge      KV blocks indexed now
  prefix_cache_evictions_total       counter    indexed blocks reused for other contents
Target only:
  specdec_target_inflight_verify_requests      gauge      Verify calls waiting on or running
                                                          in the model (the HPA's metric)
Coordinator (one registry per Serve replica):
  specdec_spec_decode_num_drafts_total                      counter  rounds that drafted
  specdec_spec_decode_num_draft_tokens_total                counter  tokens drafted
  specdec_spec_decode_num_accepted_tokens_total             counter  drafts accepted
  specdec_spec_decode_num_accepted_tokens_per_pos_total{position}  counter (0-based)
  specdec_coordinator_drafter_rounds_total{drafter}         counter  rounds with drafts,
  specdec_coordinator_drafter_draft_tokens_total{drafter}      by drafter=model|lookup
  specdec_coordinator_drafter_accepted_tokens_total{drafter}   (coordinator.drafters.costs)
  specdec_coordinator_round_duration_seconds                histogram  one round
  specdec_coordinator_round_draft_tokens                    histogram  K per round (the
                                                      K load-aware K chose; 0 = target only)
  specdec_coordinator_rpc_duration_seconds{rpc}             histogram  rpc=propose|verify,
                                                                       every attempt
  specdec_coordinator_active_generations                    gauge
  specdec_coordinator_generated_tokens_total                counter
  specdec_coordinator_draft_fallbacks_total                 counter  draft failures (the
                                                      generation goes on target-only a while)
  specdec_coordinator_resyncs_total{rpc}                    counter  re-prefills
  specdec_coordinator_target_repins_total                   counter
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# 1 ms .. 2 s (+Inf): a tiny model's decode step up to a long CPU prefill.
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
ROUND_BUCKETS = LATENCY_BUCKETS + (5.0,)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
K_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16)
TOKEN_BUCKETS = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
PORT_TRIES = 8  # a coordinator replica tries port, port+1, ..., port+7


class SessionCounts(Protocol):
    """What the metrics read of a session store (specdec.runtime.session.SessionStore)."""

    def stats(self) -> Any:
        """Its counts now: live, checked_out, cached_tokens, evicted_idle,
        evicted_for_memory, released."""


class _Exporter:
    """A registry of its own and, once `serve` is called, the HTTP server exposing it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.port = 0
        self._httpd = None

    def serve(self, port: int, host: str = "0.0.0.0", tries: int = 1) -> int:
        """Serve /metrics on the first free port of port .. port+tries-1; returns it.

        A taken port is a warning while others remain to try, then an OSError."""
        host = host.strip("[]")  # "[::]" as in a gRPC address
        for candidate in range(port, port + max(tries, 1)):
            try:
                self._httpd, _ = start_http_server(candidate, host, self.registry)
            except OSError as exc:
                if candidate + 1 >= port + max(tries, 1):
                    raise OSError(f"cannot serve metrics on {host}:{candidate}: {exc}") from exc
                log.warning("metrics port %s:%d is taken (%s); trying %d", host, candidate,
                            exc, candidate + 1)
                continue
            self.port = candidate
            return candidate
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


# -- model services ----------------------------------------------------------------------


class ModelMetrics:
    """What a model service reports. This base reports nothing (metrics off)."""

    enabled = False
    port = 0

    def forward(self, seconds: float, tokens: int) -> None:
        """One forward pass that fed `tokens` tokens took `seconds`."""

    def batch(self, sessions: int, tokens: int, queue_wait_s: list[float]) -> None:
        """One pass of the continuous scheduler: sessions and tokens in it, and how long
        each of its steps waited in the queue."""

    def inflight(self, sessions: int = 1) -> contextlib.AbstractContextManager:
        """Around one Verify request (queued or running), or a VerifyBatch of `sessions`
        items (each counts as one Verify): the target's load gauge."""
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


class PrometheusModelMetrics(_Exporter, ModelMetrics):
    enabled = True

    def __init__(self, kind: str, store: SessionCounts | None = None):
        """kind: "draft" or "target"; store: whose session counts to report."""
        _Exporter.__init__(self)
        self.prefix = prefix = f"specdec_{kind}_"
        r = self.registry
        self.forward_seconds = Histogram(
            prefix + "forward_duration_seconds",
            "Duration of one model forward pass (a prefill or one decode step).",
            buckets=LATENCY_BUCKETS, registry=r)
        self.tokens_fed = Counter(prefix + "tokens_fed_total",
                                  "Tokens fed through the model.", registry=r)
        self.batch_sessions = Histogram(
            prefix + "batch_sessions",
            "Sessions (requests) per forward pass of the continuous scheduler.",
            buckets=BATCH_BUCKETS, registry=r)
        self.batch_tokens = Histogram(
            prefix + "batch_tokens", "Tokens fed per forward pass.",
            buckets=TOKEN_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            prefix + "queue_wait_seconds",
            "Time a step waited in the scheduler's queue before its forward pass.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.inflight_gauge = None
        if kind == "target":
            self.inflight_gauge = Gauge(
                "specdec_target_inflight_verify_requests",
                "Verify requests (VerifyBatch items each count) waiting on or running in "
                "the model now.", registry=r)
        if store is not None:
            r.register(SessionStoreCollector(prefix, store))

    def track_kv_pool(self, pool_bytes) -> None:
        """Report `pool_bytes()` as specdec_<kind>_kv_pool_bytes: what the KV cache holds
        of the process's memory (a paged pool grows and is kept; a soak's RSS check
        subtracts it)."""
        Gauge(self.prefix + "kv_pool_bytes",
              "Bytes allocated to the KV cache's block pool (paged layouts; 0 otherwise).",
              registry=self.registry).set_function(pool_bytes)

    def track_prefix_cache(self, stats) -> None:
        """Report `stats()` (a PrefixCacheStats, or None: no prefix cache) as
        specdec_<kind>_prefix_cache_*."""
        self.registry.register(PrefixCacheCollector(self.prefix, stats))

    def forward(self, seconds: float, tokens: int) -> None:
        self.forward_seconds.observe(seconds)
        self.tokens_fed.inc(tokens)

    def batch(self, sessions: int, tokens: int, queue_wait_s: list[float]) -> None:
        self.batch_sessions.observe(sessions)
        self.batch_tokens.observe(tokens)
        for wait in queue_wait_s:
            self.queue_wait.observe(wait)

    @contextlib.contextmanager
    def inflight(self, sessions: int = 1) -> Iterator[None]:
        if self.inflight_gauge is None:
            yield
            return
        self.inflight_gauge.inc(sessions)
        try:
            yield
        finally:
            self.inflight_gauge.dec(sessions)


class SessionStoreCollector(Collector):
    """The session store's own counts (SessionStore.stats), read at scrape time."""

    def __init__(self, prefix: str, store: SessionCounts):
        self.prefix = prefix
        self.store = store

    def describe(self):
        return list(self.collect())

    def collect(self):
        s = self.store.stats()
        p = self.prefix
        yield GaugeMetricFamily(p + "live_sessions", "Sessions (KV caches) held now.",
                                value=s.live)
        yield GaugeMetricFamily(p + "busy_sessions", "Sessions a request is using now.",
                                value=s.checked_out)
        yield GaugeMetricFamily(p + "cached_tokens",
                                "KV-cache positions held or reserved over all sessions.",
                                value=s.cached_tokens)
        evictions = CounterMetricFamily(
            p + "session_evictions", "Sessions evicted: idle past the TTL, or (memory) to "
            "fit the KV-cache budget.", labels=["reason"])
        evictions.add_metric(["idle"], s.evicted_idle)
        evictions.add_metric(["memory"], s.evicted_for_memory)
        yield evictions
        yield CounterMetricFamily(p + "released_sessions", "Sessions freed by Release.",
                                  value=s.released)


class PrefixCacheCollector(Collector):
    """A paged backend's prefix-cache counts (PrefixCacheStats), read at scrape time;
    nothing when the backend has no prefix cache."""

    def __init__(self, prefix: str, stats):
        self.prefix = prefix
        self.stats = stats

    def describe(self):
        return list(self.collect())

    def collect(self):
        s = self.stats()
        if s is None:
            return
        p = self.prefix + "prefix_cache_"
        for name, help_, value in (
                ("lookups", "Session passes that could have been served cached KV blocks.",
                 s.lookups),
                ("hits", "Session passes served at least one cached KV block.", s.hits),
                ("hit_tokens", "Fed tokens served from the prefix cache (not computed).",
                 s.hit_tokens),
                ("evictions", "Cached KV blocks evicted to hold other contents.",
                 s.evictions)):
            yield CounterMetricFamily(p + name, help_, value=value)
        yield GaugeMetricFamily(p + "blocks", "KV blocks the prefix cache indexes now.",
                                value=s.cached_blocks)


# -- coordinator -------------------------------------------------------------------------


class LoopMetrics:
    """What the speculative loop reports. This base reports nothing (metrics off)."""

    enabled = False
    port = 0

    def generation_started(self) -> None: ...
    def generation_finished(self) -> None: ...
    def round(self, seconds: float, k: int = 0) -> None: ...
    def rpc(self, rpc: str, seconds: float) -> None: ...
    def drafted(self, num_draft: int, num_accepted: int) -> None: ...
    def drafter(self, drafter: str, num_draft: int, num_accepted: int) -> None: ...
    def generated(self, tokens: int) -> None: ...
    def resync(self, rpc: str) -> None: ...
    def draft_fallback(self) -> None: ...
    def target_repin(self) -> None: ...
    def predraft(self, used: bool) -> None: ...
    def confidence_exit(self) -> None: ...
    def heads(self, sizes: list[int]) -> None: ...
    def costs(self, terms: dict[str, float]) -> None: ...

    def close(self) -> None:
        pass


class PrometheusLoopMetrics(_Exporter, LoopMetrics):
    enabled = True

    def __init__(self) -> None:
        _Exporter.__init__(self)
        r = self.registry
        self.num_drafts = Counter("specdec_spec_decode_num_drafts_total",
                                  "Rounds that drafted tokens.", registry=r)
        self.num_draft_tokens = Counter("specdec_spec_decode_num_draft_tokens_total",
                                        "Draft tokens proposed and verified.", registry=r)
        self.num_accepted = Counter("specdec_spec_decode_num_accepted_tokens_total",
                                    "Draft tokens accepted.", registry=r)
        self.accepted_per_pos = Counter(
            "specdec_spec_decode_num_accepted_tokens_per_pos_total",
            "Draft tokens accepted, by position in the round (0 = first draft).",
            ["position"], registry=r)
        self.round_seconds = Histogram(
            "specdec_coordinator_round_duration_seconds",
            "Duration of one round (propose, verify, decide).", buckets=ROUND_BUCKETS,
            registry=r)
        self.round_k = Histogram(
            "specdec_coordinator_round_draft_tokens",
            "Drafts verified per round: the K chosen (load-aware K shrinks it under load; "
            "0 = a target-only round).", buckets=K_BUCKETS, registry=r)
        self.head_size = Histogram(
            "specdec_coordinator_contrastive_head_size",
            "Contrastive decoding: |V_head|, the expert's plausible set, per position "
            "scored (its ids and values cross the wire).",
            buckets=(1, 2, 3, 5, 8, 13, 21, 34, 64, 128, 512), registry=r)
        self.rpc_seconds = Histogram(
            "specdec_coordinator_rpc_duration_seconds",
            "Duration of one Propose or Verify attempt, as the coordinator sees it.",
            ["rpc"], buckets=LATENCY_BUCKETS, registry=r)
        self.active = Gauge("specdec_coordinator_active_generations",
                            "Generations running now.", registry=r)
        self.generated_tokens = Counter("specdec_coordinator_generated_tokens_total",
                                        "Tokens generated (committed).", registry=r)
        self.draft_fallbacks = Counter(
            "specdec_coordinator_draft_fallbacks_total",
            "Draft failures; each sends its generation to target-only decoding for a "
            "back-off.", registry=r)
        self.resyncs = Counter(
            "specdec_coordinator_resyncs_total",
            "Re-prefills after FAILED_PRECONDITION or NOT_FOUND.", ["rpc"], registry=r)
        self.target_repins = Counter("specdec_coordinator_target_repins_total",
                                     "Generations moved to another target replica.",
                                     registry=r)
        self.predrafts = Counter(
            "specdec_coordinator_predrafts_total",
            "Pipelined pre-drafts, by outcome: used (the round's drafts were ready when "
            "Verify returned) or wasted.", ["outcome"], registry=r)
        for outcome in ("used", "wasted"):
            self.predrafts.labels(outcome)
        self.confidence_exits = Counter(
            "specdec_coordinator_confidence_exits_total",
            "Rounds the draft cut short because its probability of its own token fell "
            "below the adaptive threshold.", registry=r)
        self.drafter_counters = [Counter(
            f"specdec_coordinator_drafter_{what}_total",
            f"{help_} by the drafter that supplied them: model (the draft service) or "
            "lookup (model-free, coordinator.drafters.trie).", ["drafter"], registry=r)
            for what, help_ in (("rounds", "Rounds with drafts,"),
                                ("draft_tokens", "Draft tokens verified,"),
                                ("accepted_tokens", "Draft tokens accepted,"))]
        for rpc in ("propose", "verify"):  # exported at 0 from the start
            self.rpc_seconds.labels(rpc)
            self.resyncs.labels(rpc)
        self.cost_terms = Gauge(
            "specdec_coordinator_planner_cost_seconds",
            "The drafting decision's fitted step costs (coordinator.loop.costs), by term: "
            "verify_base, verify_per_token, verify_per_prefill_token, verify_draft_busy "
            "(what the draft computing beside a Verify adds to it), draft_pass_base, "
            "draft_pass_per_session, draft_first_base, draft_first_per_token, "
            "overhead_base, overhead_per_generation, overhead_per_drafting.",
            ["term"], registry=r)

    def generation_started(self) -> None:
        self.active.inc()

    def generation_finished(self) -> None:
        self.active.dec()

    def round(self, seconds: float, k: int = 0) -> None:
        self.round_seconds.observe(seconds)
        self.round_k.observe(k)

    def rpc(self, rpc: str, seconds: float) -> None:
        self.rpc_seconds.labels(rpc).observe(seconds)

    def drafted(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts.inc()
        self.num_draft_tokens.inc(num_draft)
        self.num_accepted.inc(num_accepted)
        for i in range(num_accepted):
            self.accepted_per_pos.labels(str(i)).inc()

    def drafter(self, drafter: str, num_draft: int, num_accepted: int) -> None:
        for counter, n in zip(self.drafter_counters, (1, num_draft, num_accepted), strict=True):
            counter.labels(drafter).inc(n)

    def generated(self, tokens: int) -> None:
        self.generated_tokens.inc(tokens)

    def resync(self, rpc: str) -> None:
        self.resyncs.labels(rpc).inc()

    def draft_fallback(self) -> None:
        self.draft_fallbacks.inc()

    def target_repin(self) -> None:
        self.target_repins.inc()

    def predraft(self, used: bool) -> None:
        self.predrafts.labels("used" if used else "wasted").inc()

    def confidence_exit(self) -> None:
        self.confidence_exits.inc()

    def heads(self, sizes: list[int]) -> None:
        for n in sizes:
            self.head_size.observe(n)

    def costs(self, terms: dict[str, float]) -> None:
        for term, seconds in terms.items():
            self.cost_terms.labels(term).set(seconds)
