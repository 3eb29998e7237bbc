"""Coordinator configuration and its command-line flags.

The loop's defaults (K, pipelining, adaptive K, the confidence exit) come from
coordinator.loop.policy.LoopPolicy, the one place that defines them.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields

from coordinator.drafters.base import DRAFTERS
from coordinator.loop.policy import DEFAULT_POLICY as P
from coordinator.loop.policy import LoopPolicy

DEFAULT_PORT = 50050
# Ray runs its worker processes (a Serve replica is one) at niceness 15 by default. A
# coordinator replica's lockstep engine is on the critical path of every step: at 15, on
# a machine whose cores the model services keep busy, it waits for CPU between the
# services' calls. Wherever specdec starts Ray, its workers run at the services' priority.
RAY_ENVIRONMENT = {"RAY_worker_niceness": "0"}
DEFAULT_HTTP_PORT = 8000


@dataclass
class CoordinatorConfig:
    draft: str = ""  # comma-separated host:port list; "" = no draft (target-only)
    target: str = "127.0.0.1:50052"
    dns_refresh: float = 5.0  # seconds between lookups of dns: entries
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    http_host: str = "127.0.0.1"
    http_port: int = DEFAULT_HTTP_PORT  # 0 = no HTTP API
    served_model_name: str = ""  # "" = the target's model_id
    request_timeout: float = 600.0
    api_keys: str = ""  # a key file (coordinator.api.auth); "" = no authentication
    api_key_concurrency: int = 0  # generations at once per key and replica; 0 = no cap
    model: str = ""  # tokenizer source; "" = the target's model_id
    k: int = P.k
    pipeline: bool = P.pipeline
    adaptive_k: bool = P.adaptive_k
    load_aware_k: bool = P.load_aware_k
    confidence_exit: bool = P.confidence_exit
    exit_threshold: float = P.exit_threshold
    exit_target_acceptance: float = P.exit_target_acceptance
    inject_rtt_ms: float = 0.0
    inject_jitter_ms: float = 0.0
    top_n: int = P.top_n
    drafter: str = P.drafter
    lookup_k: int = P.lookup_k
    lookup_min_match: int = P.lookup_min_match
    lookup_cache: int = P.lookup_cache
    couple_bonus: bool = P.couple_bonus
    max_new_tokens_cap: int = 4096
    max_concurrency: int = 32
    rpc_deadline: float = 30.0
    draft_backoff: float = 1.0
    startup_timeout: float = 120.0
    # TLS to the draft and target services (specdec.tls.client_tls); "" = plaintext.
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""
    # TLS on the client API (coordinator.deploy.front); "" = plaintext through Serve's proxies.
    api_tls_cert: str = ""
    api_tls_key: str = ""
    api_tls_client_ca: str = ""
    ray_address: str = ""
    min_replicas: int = 1
    max_replicas: int = 1
    target_ongoing_requests: float = 8.0
    upscale_delay: float = 30.0  # Serve's defaults
    downscale_delay: float = 600.0
    autoscale_look_back: float = 30.0  # Serve's look_back_period_s
    max_replicas_per_node: int = 0  # 0 = no cap
    graceful_shutdown_timeout: float = 660.0  # a draining replica's generations finish
    expose_replicas: bool = False  # GenerationStats say who served (internal names)
    metrics_port: int = 0  # 0 = no metrics; each Serve replica serves its own
    # The Responses API's store (coordinator.api.response_store): "" = under SPECDEC_HOME
    response_store: str = ""
    response_store_max: int = 10_000
    response_store_max_age: float = 30 * 24 * 3600.0
    log_level: str = "INFO"

    def to_dict(self) -> dict:
        return asdict(self)

    def policy(self) -> LoopPolicy:
        """The loop policy these fields set (same names; the rest keep their defaults)."""
        return LoopPolicy(**{f.name: getattr(self, f.name) for f in fields(LoopPolicy)
                             if f.name in _FIELDS})


# Fields a Serve replica may also take from its environment (SPECDEC_<FIELD>), where the
# application's args leave them at their defaults: file paths of mounted Secrets, which
# belong to the pod (k8s/components/tls, api-keys) rather than to the Serve config.
ENV_FIELDS = ("tls_ca", "tls_cert", "tls_key", "tls_server_name", "api_keys",
              "api_key_concurrency", "response_store")


def with_environment(config: dict, environ=None) -> dict:
    """`config` with each ENV_FIELDS field it leaves at the default taken from
    SPECDEC_<FIELD> when that is set."""
    import os

    environ = os.environ if environ is None else environ
    defaults = CoordinatorConfig()
    out = dict(config)
    for name in ENV_FIELDS:
        value = environ.get(f"SPECDEC_{name.upper()}")
        if value and out.get(name, getattr(defaults, name)) == getattr(defaults, name):
            kind = type(getattr(defaults, name))
            try:
                out[name] = kind(value)
            except ValueError:
                raise ValueError(f"SPECDEC_{name.upper()}={value!r} is not a valid "
                                 f"{kind.__name__}") from None
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m coordinator",
        description="specdec coordinator: a Ray Serve application serving specdec.v1.Generator "
                    "over gRPC; runs the speculative loop against draft and target services.",
    )
    p.add_argument("--draft", default="", metavar="ADDR[,ADDR...]",
                   help="draft service replicas (host:port, comma-separated); empty = "
                        "target-only decoding")
    p.add_argument("--target", default="127.0.0.1:50052", metavar="ADDR[,ADDR...]",
                   help="target service replicas (default: %(default)s)")
    p.add_argument("--dns-refresh", type=float, default=5.0, metavar="SECONDS",
                   help="how often dns:NAME:PORT entries of --draft/--target are resolved "
                        "again (a pool with no usable replica resolves at once) "
                        "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="where clients reach the gRPC port (for logs; Ray Serve's proxy "
                        "listens on all interfaces) (default: %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="gRPC port for clients (default: %(default)s)")
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT,
                   help="port of the OpenAI-compatible HTTP API (/v1/chat/completions, "
                        "/v1/completions, /v1/models, /health) and the browser demo (/demo), "
                        "served by Ray Serve's HTTP proxy; 0 = no HTTP (default: %(default)s)")
    p.add_argument("--http-host", default="127.0.0.1",
                   help="interface the HTTP API listens on; 0.0.0.0 for all, as in a pod "
                        "(default: %(default)s)")
    p.add_argument("--served-model-name", default="",
                   help="the model name clients send as `model` and /v1/models lists; "
                        "default: the target's model_id")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="longest an HTTP request may run (a request's own `timeout` field "
                        "can only shorten it); past it the answer is 504 "
                        "(default: %(default)s)")
    p.add_argument("--api-keys", default="", metavar="FILE",
                   help="require an API key on the client API (gRPC 'authorization: Bearer "
                        "<key>' metadata, HTTP Authorization header): a file with one key "
                        "per line, optionally 'name:key' (e.g. a mounted Secret); health, "
                        "/demo and metrics need none; default: no authentication")
    p.add_argument("--api-key-concurrency", type=int, default=0, metavar="N",
                   help="with --api-keys: at most N generations at once per key on each "
                        "coordinator replica, past it RESOURCE_EXHAUSTED / 429; 0 = no cap "
                        "(default: %(default)s)")
    p.add_argument("--model", default="",
                   help="model whose tokenizer to use (name or folder); default: the "
                        "target's model_id. Its digest must match the services'")
    p.add_argument("--k", type=int, default=P.k,
                   help="draft tokens per round when a request does not say (default: "
                        "%(default)s)")
    on_off = argparse.BooleanOptionalAction
    p.add_argument("--pipeline", action=on_off, default=P.pipeline,
                   help="pipelined drafting: while the target verifies round r, the draft "
                        "drafts round r+1 assuming all K are accepted (the draft proposes K+1; "
                        "the last is its guess of the bonus). Same output, overlapped rounds; "
                        "--no-pipeline runs sequential rounds (default: %(default)s)")
    p.add_argument("--adaptive-k", action=on_off, default=P.adaptive_k,
                   help="choose K each round from measured acceptance and draft/verify "
                        "latency (a request's K is the starting point); greedy output is "
                        "unchanged, sampled output then depends on timing "
                        "(default: %(default)s)")
    p.add_argument("--load-aware-k", action=on_off, default=P.load_aware_k,
                   help="when a request leaves K to the server, choose each generation's "
                        "K every step from both services' measured costs (the target's "
                        "pass by width, the draft's passes, what drafting adds to the "
                        "target's pass and the coordinator's time) and the generation's "
                        "own acceptance, started from its kind's (goodput, "
                        "coordinator.loop.plan), down to 0 (target-only) where its drafts "
                        "do not pay; greedy output is unchanged, sampled output stays "
                        "exact in distribution but depends on timing; off: every "
                        "generation drafts --k (default: %(default)s)")
    p.add_argument("--confidence-exit", action=on_off, default=P.confidence_exit,
                   help="the draft stops a round early once its probability of its own token "
                        "falls below a threshold that adapts to the generation's acceptance "
                        "(up when acceptance is below --exit-target-acceptance, down above). "
                        "Depends on tokens only: seeded output stays reproducible "
                        "(default: %(default)s)")
    p.add_argument("--exit-threshold", type=float, default=P.exit_threshold,
                   help="the confidence exit's starting threshold, in [0, 1) "
                        "(default: %(default)s)")
    p.add_argument("--exit-target-acceptance", type=float, default=P.exit_target_acceptance,
                   help="the per-token acceptance the confidence exit steers towards "
                        "(default: %(default)s)")
    p.add_argument("--inject-rtt-ms", type=float, default=0.0,
                   help="emulate draft and target on other hosts: add this round-trip time "
                        "to every Propose and Verify (testing and benchmarks) "
                        "(default: %(default)s)")
    p.add_argument("--inject-jitter-ms", type=float, default=0.0,
                   help="plus up to this much random extra round-trip time "
                        "(default: %(default)s)")
    p.add_argument("--top-n", type=int, default=P.top_n,
                   help="size of the sparse draft distribution per token; 0 = the draft's "
                        "default (default: %(default)s)")
    p.add_argument("--drafter", default=P.drafter, choices=list(DRAFTERS),
                   help="who drafts: model = the draft service; lookup = model-free, "
                        "continuations of the context found in the prompt and the text so "
                        "far (a suffix trie, SuffixDecoding-style; works without a draft "
                        "service); hybrid = per round, the look-up when its match is at "
                        "least --lookup-min-match tokens or it is expected to give more "
                        "tokens/s, else the draft service (default: %(default)s)")
    p.add_argument("--lookup-k", type=int, default=P.lookup_k,
                   help="most drafts per look-up round (capped by the target's "
                        "max_draft_tokens; 0 = no look-up) (default: %(default)s)")
    p.add_argument("--lookup-min-match", type=int, default=P.lookup_min_match,
                   help="hybrid: a context suffix of this many tokens seen before, with a "
                        "continuation, makes the look-up draft the round "
                        "(default: %(default)s)")
    p.add_argument("--lookup-cache", type=int, default=P.lookup_cache, metavar="N",
                   help="the look-up also drafts from each tenant's N most recent outputs "
                        "(a tenant is an API key's name; one tenant without --api-keys); "
                        "tenants never see each other's; 0 = off (default: %(default)s)")
    p.add_argument("--couple-bonus", action=on_off, default=P.couple_bonus,
                   help="sampled pipelined rounds: the target draws the bonus and the draft "
                        "its guess at it with the same Gumbel noise (still an exact draw "
                        "from the target's distribution), so pre-drafts hold more often "
                        "(default: %(default)s)")
    p.add_argument("--max-new-tokens-cap", type=int, default=4096,
                   help="largest max_new_tokens a request may ask for (default: %(default)s)")
    p.add_argument("--max-concurrency", type=int, default=32,
                   help="generations at once per coordinator replica; more get "
                        "RESOURCE_EXHAUSTED (default: %(default)s)")
    p.add_argument("--rpc-deadline", type=float, default=30.0, metavar="SECONDS",
                   help="deadline of every Propose/Verify call (default: %(default)s)")
    p.add_argument("--draft-backoff", type=float, default=1.0, metavar="SECONDS",
                   help="after a draft failure, decode target-only this long (doubling on "
                        "repeated failures) before trying a draft again (default: %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="how long to wait for the services and for Serve to deploy "
                        "(default: %(default)s)")
    p.add_argument("--tls-ca", default="", metavar="PEM",
                   help="talk TLS to the draft and target services and verify their "
                        "certificates against this CA bundle; default: plaintext")
    p.add_argument("--tls-cert", default="", metavar="PEM",
                   help="mutual TLS: the client certificate presented to the draft and "
                        "target services (with --tls-key). Re-read when it changes: new "
                        "channels use the new one")
    p.add_argument("--tls-key", default="", metavar="PEM",
                   help="the private key of --tls-cert (unencrypted PEM)")
    p.add_argument("--tls-server-name", default="",
                   help="the name the services' certificates must carry, when it is not "
                        "the host dialled (default: that host; for dns:NAME:PORT, NAME)")
    p.add_argument("--api-tls-cert", default="", metavar="PEM",
                   help="serve the client API (the gRPC --port and the HTTP --http-port) over "
                        "TLS with this certificate (chain), which must name the hosts clients "
                        "dial; reloaded when it changes. Then Serve's proxies listen on "
                        "loopback only, behind TLS servers in this process. Default: "
                        "plaintext")
    p.add_argument("--api-tls-key", default="", metavar="PEM",
                   help="the private key of --api-tls-cert (unencrypted PEM)")
    p.add_argument("--api-tls-client-ca", default="", metavar="PEM",
                   help="with --api-tls-cert: also require a client certificate signed by "
                        "this CA bundle on the client API (mutual TLS); default: any client "
                        "(API keys can still be required with --api-keys)")
    p.add_argument("--ray-address", default="",
                   help="join this Ray cluster instead of starting an embedded one")
    p.add_argument("--min-replicas", type=int, default=1,
                   help="Serve autoscaling: fewest coordinator replicas (default: %(default)s)")
    p.add_argument("--max-replicas", type=int, default=1,
                   help="Serve autoscaling: most coordinator replicas (default: %(default)s)")
    p.add_argument("--target-ongoing-requests", type=float, default=8.0,
                   help="Serve autoscaling: ongoing requests per replica to aim for "
                        "(default: %(default)s)")
    p.add_argument("--upscale-delay", type=float, default=30.0, metavar="SECONDS",
                   help="Serve autoscaling: how long ongoing requests must stay above the "
                        "target before a replica is added (default: %(default)s)")
    p.add_argument("--downscale-delay", type=float, default=600.0, metavar="SECONDS",
                   help="Serve autoscaling: how long they must stay below it before one is "
                        "removed (default: %(default)s)")
    p.add_argument("--autoscale-look-back", type=float, default=30.0, metavar="SECONDS",
                   help="Serve autoscaling: ongoing requests are averaged over this window "
                        "(replicas report every min(10, this / 2) s) (default: %(default)s)")
    p.add_argument("--max-replicas-per-node", type=int, default=0,
                   help="Serve: at most this many coordinator replicas on one Ray node, so "
                        "that replicas spread over nodes; 0 = no cap (default: %(default)s)")
    p.add_argument("--graceful-shutdown-timeout", type=float, default=660.0,
                   metavar="SECONDS",
                   help="Serve: how long a replica being removed (scale-down, redeploy) "
                        "keeps serving the generations it has before it is stopped; "
                        "new ones go elsewhere at once. Above --request-timeout, no "
                        "generation is cut (default: %(default)s)")
    p.add_argument("--expose-replicas", action="store_true",
                   help="fill each generation's stats (gRPC GenerationStats, OpenAI "
                        "usage.specdec) with the coordinator replica and Ray node that "
                        "served it and the draft and target replicas it was pinned to; "
                        "off, no internal name reaches clients (default: off)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="each coordinator replica serves Prometheus metrics at "
                        "http://0.0.0.0:PORT/metrics (a replica finding it taken, e.g. a "
                        "second one on the node, tries PORT+1 .. PORT+7); 0 = off "
                        "(default: %(default)s)")
    p.add_argument("--response-store", default="", metavar="PATH",
                   help="the Responses API's store of responses and their conversations "
                        "(store: true, previous_response_id): an SQLite file every "
                        "coordinator replica opens; replicas on several nodes need it on "
                        "a volume they all mount (default: $SPECDEC_HOME/responses.sqlite3)")
    p.add_argument("--response-store-max", type=int, default=10_000, metavar="N",
                   help="stored responses kept; past it the oldest go (default: %(default)s)")
    p.add_argument("--response-store-max-age", type=float, default=30 * 24 * 3600.0,
                   metavar="SECONDS",
                   help="a stored response older than this is gone (404), as OpenAI's "
                        "expire after 30 days (default: %(default)s)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(default: %(default)s)")
    return p


def from_args(argv: list[str] | None = None) -> CoordinatorConfig:
    p = parser()
    ns = p.parse_args(argv)
    if not 0.0 <= ns.exit_threshold < 1.0:
        p.error(f"--exit-threshold must be in [0, 1), got {ns.exit_threshold}")
    if not 0.0 < ns.exit_target_acceptance < 1.0:
        p.error(f"--exit-target-acceptance must be in (0, 1), got {ns.exit_target_acceptance}")
    for flag, value, low in (("--lookup-k", ns.lookup_k, 0), ("--lookup-cache",
                                                              ns.lookup_cache, 0),
                             ("--lookup-min-match", ns.lookup_min_match, 1),
                             ("--response-store-max", ns.response_store_max, 1)):
        if value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    if ns.response_store_max_age <= 0:
        p.error(f"--response-store-max-age must be > 0, got {ns.response_store_max_age}")
    return CoordinatorConfig(**{f.name: getattr(ns, f.name) for f in fields(CoordinatorConfig)})


_FIELDS = {f.name for f in fields(CoordinatorConfig)}
