"""What the draft and target services share at start-up: flags, logging, model loading."""

from __future__ import annotations

import logging
import os
import time

from specdec.runtime import heap
from specdec.runtime.cached_model import CachedModel
from specdec.service_config import ModelServiceConfig, quantization_group

log = logging.getLogger(__name__)


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
        paged = cfg.kv_layout == "paged"
        kind = PagedOpenVINOBackend if paged else OpenVINOBackend
        return kind(ir_dir, cfg.device or "CPU", cfg.threads,
                               cfg.kv_cache_precision, cfg.performance_hint, model_id=model_id,
                               rollback=cfg.ov_rollback,
                               inference_precision=cfg.inference_precision,
                               dynamic_quantization=cfg.dynamic_quantization != "off",
                               dynamic_quantization_group=quantization_group(
                                   cfg.dynamic_quantization),
                               compressed_weights=cfg.weights in ("int8", "int4"),
                               **({"prefix_cache": cfg.prefix_cache} if paged else {}))
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
    # before the runtime allocates: freed buffers go back to the system (runtime.heap)
    heap.return_freed_memory()
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
        # Only after a warm-up: the plugin reads each weight once, on its first pass.
        release = getattr(backend, "release_mapped_weights", None)
        if release is not None:
            log.info("released %.0f MiB of mapped IR weights from RSS (the plugin keeps "
                     "its own copy)", release() / 2**20)
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
    metrics.track_prefix_cache(lambda: model.backend.prefix_cache_stats)
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
