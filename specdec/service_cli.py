"""What the draft and target services share at start-up: flags, logging, model loading."""

from __future__ import annotations

import argparse
import logging
import os
import time
from dataclasses import dataclass

from specdec.runtime.batching import DEFAULT_MAX_BATCH_TOKENS
from specdec.runtime.cached_model import CachedModel

log = logging.getLogger(__name__)


@dataclass
class ModelServiceConfig:
    model: str = "tiny-random"
    backend: str = "torch"
    device: str = ""  # "" = the backend's default: cpu (torch), CPU (OpenVINO)
    weights: str = "fp32"
    kv_cache_precision: str = "f32"
    inference_precision: str = "f32"
    performance_hint: str = "LATENCY"
    ov_rollback: str = "mask"
    kv_layout: str = "paged"
    dynamic_quantization: str = "auto"
    cpus: str = ""
    dtype: str = "float32"
    quantize: str = "none"
    host: str = "127.0.0.1"
    port: int = 0
    max_sessions: int = 64
    session_ttl: float = 600.0
    max_cached_tokens: int = 65536
    max_draft_tokens: int = 16
    threads: int = 0
    workers: int = 128
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    batch_linger_ms: float = 0.0
    grace: float = 5.0
    warmup: bool = True
    metrics_port: int = 0  # 0 = no metrics
    health_port: int = 0  # 0 = none; else grpc.health.v1 alone, plaintext (specdec.health_port)
    log_level: str = "INFO"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


PRECISIONS = ("auto", "f32", "bf16", "f16")


def add_model_service_flags(p: argparse.ArgumentParser, default_port: int,
                            default_precision: str = "f32",
                            default_dynamic_quantization: str = "auto") -> None:
    p.add_argument("--model", required=True,
                   help="model name (tiny-random, tiny-random-draft) or a Hugging Face model "
                        "folder on disk (required)")
    p.add_argument("--backend", default="torch", choices=["torch", "openvino"],
                   help="inference runtime (default: %(default)s)")
    p.add_argument("--device", default="",
                   help="torch: cpu or cuda:N (default cpu); openvino: CPU, GPU, NPU or AUTO "
                        "(default CPU). An unavailable device is a start-up error")
    p.add_argument("--weights", default="fp32", choices=["fp32", "int8", "int4"],
                   help="openvino: which exported IR to load (`specdec prepare --openvino "
                        "--weights ...`; tiny models are exported on the fly) "
                        "(default: %(default)s)")
    p.add_argument("--kv-cache-precision", default="f32", choices=["f32", "f16", "u8"],
                   help="openvino: KV-cache precision. The CPU plugin's own default, u8, "
                        "changes logits slightly; f32 keeps the target faithful to the "
                        "model (default: %(default)s)")
    p.add_argument("--inference-precision", default=default_precision, choices=PRECISIONS,
                   help="openvino: precision the plugin computes in. auto = the device's "
                        "fastest (bf16 on CPUs with AVX-512 BF16 or AMX, else f32). A "
                        "draft may use anything (only the target decides tokens). A target "
                        "below f32 is faster but not batch-invariant: verifying K+1 tokens "
                        "at once rounds differently from one-token steps, so greedy "
                        "speculative output can differ from target-only output "
                        "(default: %(default)s)")
    p.add_argument("--dynamic-quantization", default=default_dynamic_quantization,
                   choices=["auto", "off"],
                   help="openvino, int8/int4 weights: auto = the CPU plugin's default, which "
                        "quantizes activations in passes of more than one token, so a "
                        "position's logits change (by up to ~1 here) with the pass's size; "
                        "off = logits that depend on the prefix alone, as contrastive "
                        "decoding needs of its amateur (it refuses a draft without it) "
                        "(default: %(default)s)")
    p.add_argument("--performance-hint", default="LATENCY",
                   choices=["LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"],
                   help="openvino: the plugin's performance hint (default: %(default)s)")
    p.add_argument("--kv-layout", default="paged", choices=["paged", "stateful"],
                   help="openvino: paged = one pool of KV blocks shared by all sessions, "
                        "so concurrent requests share forward passes (continuous batching) "
                        "and rollback is free; stateful = one infer request per session, "
                        "one session per pass (default: %(default)s)")
    p.add_argument("--ov-rollback", default="mask", choices=["mask", "trim"],
                   help="openvino, --kv-layout stateful: how a rejected draft is rolled back: "
                        "mask (free; dead entries masked, compacted now and then) or "
                        "trim (copy the state tensors every time) (default: %(default)s)")
    p.add_argument("--cpus", default="",
                   help="pin this process to these CPUs, e.g. 0 or 0-1 or 0,2 (lets one box "
                        "emulate two devices: draft on one core, target on the other)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weight dtype for folder models (default: %(default)s)")
    p.add_argument("--quantize", default="none", choices=["none", "int8"],
                   help="int8: dynamic int8 quantization of the Linear layers (CPU), a "
                        "cheaper draft; output stays exact because the target verifies "
                        "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; 0.0.0.0 for all interfaces (default: %(default)s)")
    p.add_argument("--port", type=int, default=default_port,
                   help="port to listen on; 0 picks a free one (default: %(default)s)")
    p.add_argument("--max-sessions", type=int, default=64,
                   help="live sessions (KV caches) held at most; more get RESOURCE_EXHAUSTED "
                        "(default: %(default)s)")
    p.add_argument("--session-ttl", type=float, default=600.0, metavar="SECONDS",
                   help="idle seconds after which a session is evicted (default: %(default)s)")
    p.add_argument("--max-cached-tokens", type=int, default=65536,
                   help="KV-cache budget in positions over all sessions; past it idle sessions "
                        "are evicted (least recently used first), then RESOURCE_EXHAUSTED. "
                        "0 = no budget (default: %(default)s)")
    p.add_argument("--max-draft-tokens", type=int, default=16,
                   help="largest K a request may ask for (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads; 0 leaves torch's default (default: %(default)s)")
    p.add_argument("--workers", type=int, default=128,
                   help="gRPC worker threads, also the most concurrent RPCs (more get "
                        "RESOURCE_EXHAUSTED); each waiting request holds one while its steps "
                        "queue for the model (default: %(default)s)")
    p.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS,
                   help="continuous batching: most tokens fed in one forward pass; queued "
                        "steps past it wait for the next pass, and a larger prefill runs "
                        "alone (default: %(default)s)")
    p.add_argument("--batch-linger-ms", type=float, default=0.0, metavar="MS",
                   help="continuous batching: wait this long for more requests before each "
                        "pass; 0 = never wait, take what is queued (default: %(default)s)")
    p.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, seconds in-flight RPCs get to finish "
                        "(default: %(default)s)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="before serving, run a throwaway session through every pass size a "
                        "request may bring (1 to --max-draft-tokens + 2 tokens): OpenVINO "
                        "prepares its kernels per input shape on first use, which makes "
                        "the first pass of each size many times slower than the next "
                        "(docs/design.md), and the first client would otherwise wait for "
                        "it (default: on)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics, on --host; "
                        "0 = off (default: %(default)s)")
    p.add_argument("--health-port", type=int, default=0,
                   help="also answer grpc.health.v1 (and nothing else) in plaintext on this "
                        "port, on --host: for probes that cannot do (m)TLS, such as "
                        "Kubernetes' gRPC probes; 0 = off (default: %(default)s)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(default: %(default)s)")


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def parse_cpus(text: str) -> set[int]:
    """'0' / '0-1' / '0,2' -> {0} / {0, 1} / {0, 2}."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def load_backend(cfg: ModelServiceConfig):
    skip = tuple(getattr(cfg, "skip_layers", ()))  # the draft's self-speculative set
    order = tuple(getattr(cfg, "skip_on_the_fly", ()))
    if order and (skip or cfg.backend == "openvino"):
        raise ValueError("--skip-on-the-fly needs --backend torch and no --skip-layers (it "
                         "chooses the set itself, from the whole model)")
    head = int(getattr(cfg, "head_vocab", 0))  # an FR-Spec draft's sliced LM head
    if head and cfg.backend != "openvino":
        raise ValueError(f"--head-vocab {head} needs --backend openvino (the sliced head is "
                         "an exported IR: specdec prepare --openvino --weights WEIGHTS "
                         f"--head-vocab {head})")
    backend = _load_backend(cfg, skip, order, head)
    backend.skip_layers = skip
    return backend


def _load_backend(cfg: ModelServiceConfig, skip: tuple[int, ...], order: tuple[int, ...] = (),
                  head: int = 0):
    if cfg.backend == "openvino":
        from specdec.runtime.openvino_backend import OpenVINOBackend
        from specdec.runtime.openvino_export import resolve_ir
        from specdec.runtime.openvino_paged import PagedOpenVINOBackend

        ir_dir, model_id = resolve_ir(cfg.model, cfg.weights, skip, head)
        kind = PagedOpenVINOBackend if cfg.kv_layout == "paged" else OpenVINOBackend
        return kind(ir_dir, cfg.device or "CPU", cfg.threads,
                               cfg.kv_cache_precision, cfg.performance_hint, model_id=model_id,
                               rollback=cfg.ov_rollback,
                               inference_precision=cfg.inference_precision,
                               dynamic_quantization=cfg.dynamic_quantization != "off",
                               compressed_weights=cfg.weights in ("int8", "int4"))
    from specdec.runtime.models import load
    from specdec.runtime.torch_backend import TorchBackend

    device = cfg.device or "cpu"
    loaded = load(cfg.model, device, cfg.dtype)
    if skip:
        from specdec.runtime.layer_skip import drop_layers

        drop_layers(loaded.model, skip)
    dynamic = None
    if order:
        from specdec.runtime.dynamic_skip import DynamicSkip
        from specdec.runtime.layer_skip import validate

        validate((max(order),), int(loaded.model.config.num_hidden_layers))  # in range
        dynamic = DynamicSkip(loaded.model)
    if cfg.quantize == "int8":
        from specdec.runtime.models import quantize_int8

        quantize_int8(loaded)
    backend = TorchBackend(loaded, device)
    backend.dynamic_skip = dynamic
    # torch's dynamic int8 scales activations per pass: logits depend on the batch.
    backend.batch_dependent_logits = cfg.quantize == "int8"
    return backend


def load_cached_model(cfg: ModelServiceConfig) -> CachedModel:
    """Load the model named by cfg into a backend with a bounded session store."""
    import torch

    if cfg.cpus:
        cpus = parse_cpus(cfg.cpus)
        os.sched_setaffinity(0, cpus)  # before any runtime starts its threads
        log.info("pinned to CPUs %s", sorted(cpus))
    threads = cfg.threads or (len(parse_cpus(cfg.cpus)) if cfg.cpus else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    backend = load_backend(cfg)
    log.info("loaded model %s (%s) in %.2f s", cfg.model, cfg.backend,
             time.perf_counter() - t0)
    model = CachedModel(backend, cfg.max_sessions, cfg.session_ttl, cfg.max_cached_tokens,
                        max_batch_tokens=cfg.max_batch_tokens,
                        linger_s=cfg.batch_linger_ms / 1000)
    if cfg.warmup:
        seconds = model.warm_up(cfg.max_draft_tokens + 2)
        log.info("warmed up passes of 1 to %d tokens in %.2f s", cfg.max_draft_tokens + 2,
                 seconds)
    model.store.start_reaper()
    return model


def start_metrics(kind: str, cfg: ModelServiceConfig, model: CachedModel) -> None:
    """--metrics-port > 0: report `model` ("draft" or "target") at /metrics on --host.

    A taken port raises OSError (a start-up failure, like the gRPC port)."""
    if cfg.metrics_port <= 0:
        return
    from specdec.metrics import PrometheusModelMetrics

    metrics = PrometheusModelMetrics(kind, model.store)
    metrics.track_kv_pool(lambda: model.backend.kv_pool_bytes)
    metrics.serve(cfg.metrics_port, cfg.host)
    model.metrics = metrics


def log_start(kind: str, cfg: ModelServiceConfig, port: int, model: CachedModel) -> None:
    extra = "" if cfg.quantize == "none" else f" quantize={cfg.quantize}"
    if cfg.backend == "openvino":
        extra += (f" weights={cfg.weights} kv={cfg.kv_cache_precision} layout={cfg.kv_layout}"
                  f" precision={model.backend.inference_precision}")
    skip = model.backend.skip_layers
    if skip:
        from specdec.runtime.layer_skip import format_set

        extra += f" skip-layers={format_set(skip)}"
    order = getattr(cfg, "skip_on_the_fly", ())
    if order:
        extra += f" skip-on-the-fly={','.join(map(str, order))}"
    head = model.backend.head_vocab
    if head:
        extra += f" head-vocab={head}"
    if cfg.cpus:
        extra += f" cpus={cfg.cpus}"
    if cfg.metrics_port > 0:
        extra += f" metrics-port={cfg.metrics_port}"
    if cfg.health_port > 0:
        extra += f" health-port={cfg.health_port}"
    device = cfg.device or ("CPU" if cfg.backend == "openvino" else "cpu")
    log.info("%s service ready: model=%s backend=%s device=%s%s vocab=%d address=%s:%d",
             kind, cfg.model, cfg.backend, device, extra, model.vocab_size, cfg.host, port)


def run(kind: str, cfg: ModelServiceConfig, create) -> int:
    """Set up logging, build the service with `create(cfg)`, serve until SIGTERM/SIGINT.

    Start-up failures (model folder missing, port in use) are one clear log line and
    exit status 2, not a traceback.
    """
    from specdec.grpc_server import serve_until_signal
    from specdec.health_port import HealthPort

    setup_logging(cfg.log_level)
    health = None
    try:
        server, port, engine = create(cfg)
        if cfg.health_port > 0:
            health = HealthPort(server.health, cfg.host, cfg.health_port).start()
    except (OSError, ValueError) as exc:
        log.error("cannot start the %s service: %s", kind, exc)
        return 2
    try:
        serve_until_signal(server, cfg.grace,
                           on_ready=lambda: log_start(kind, cfg, port, engine.model))
    finally:
        engine.model.metrics.close()
        if health is not None:
            health.stop()
    return 0
