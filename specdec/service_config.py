"""How a model service (draft or target) runs: ModelServiceConfig, the one description of
its settings; the flags that set them (add_model_service_flags, each default the
field's); and `command_line`, which spells given settings as those flags, for whoever
launches a service (specdec.pair.ServiceSpec, and through it specdec up, the bench, the
tests and the scale-out runs). Role-specific settings extend it (draft_service.config,
target_service.config)."""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass


def dynamic_quantization(text: str) -> str:
    """--dynamic-quantization's value: auto, off, or a group size (a multiple of 32)."""
    if text in ("auto", "off") or (text.isdigit() and int(text) > 0 and int(text) % 32 == 0):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, off or a group size that is a "
                                     f"positive multiple of 32, got {text!r}")


def quantization_group(value: str) -> int:
    """The group size --dynamic-quantization names; 0 for auto and off."""
    return int(value) if value.isdigit() else 0


# Continuous batching: most tokens fed in one forward pass (--max-batch-tokens).
DEFAULT_MAX_BATCH_TOKENS = 2048


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
    prefix_cache: bool = True
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


D = ModelServiceConfig()
PRECISIONS = ("auto", "f32", "bf16", "f16")


def add_model_service_flags(p: argparse.ArgumentParser, default_port: int,
                            default_precision: str = D.inference_precision,
                            default_dynamic_quantization: str = D.dynamic_quantization,
                            ) -> None:
    """The flags of ModelServiceConfig's fields (each default is the field's, but the
    role's port, precision and dynamic quantization)."""
    p.add_argument("--model", required=True,
                   help="model name (tiny-random, tiny-random-draft) or a Hugging Face model "
                        "folder on disk (required)")
    p.add_argument("--backend", default=D.backend, choices=["torch", "openvino"],
                   help="inference runtime (default: %(default)s)")
    p.add_argument("--device", default=D.device,
                   help="torch: cpu or cuda:N (default cpu); openvino: CPU, GPU, NPU or AUTO "
                        "(default CPU). An unavailable device is a start-up error")
    p.add_argument("--weights", default=D.weights, choices=["fp32", "int8", "int4"],
                   help="openvino: which exported IR to load (`specdec prepare --openvino "
                        "--weights ...`; tiny models are exported on the fly) "
                        "(default: %(default)s)")
    p.add_argument("--kv-cache-precision", default=D.kv_cache_precision,
                   choices=["f32", "f16", "u8"],
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
                   type=dynamic_quantization, metavar="auto|off|GROUP",
                   help="openvino, int8/int4 weights: auto = the CPU plugin's default, which "
                        "quantizes activations to int8 in groups of 32 in passes of more "
                        "than one token, so a position's logits change (by up to ~1 here) "
                        "with the pass's size; GROUP = the same in groups of this many "
                        "(a multiple of 32; larger is faster and coarser); off = logits "
                        "that depend on the prefix alone, as contrastive decoding needs of "
                        "its amateur (it refuses a draft without it) (default: "
                        "%(default)s)")
    p.add_argument("--performance-hint", default=D.performance_hint,
                   choices=["LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"],
                   help="openvino: the plugin's performance hint (default: %(default)s)")
    p.add_argument("--kv-layout", default=D.kv_layout, choices=["paged", "stateful"],
                   help="openvino: paged = one pool of KV blocks shared by all sessions, "
                        "so concurrent requests share forward passes (continuous batching) "
                        "and rollback is free; stateful = one infer request per session, "
                        "one session per pass (default: %(default)s)")
    p.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction,
                   default=D.prefix_cache,
                   help="openvino, --kv-layout paged: reuse full KV blocks across sessions "
                        "whose prompts share a prefix (automatic prefix caching; "
                        "docs/design.md, section 23) (default: on)")
    p.add_argument("--ov-rollback", default=D.ov_rollback, choices=["mask", "trim"],
                   help="openvino, --kv-layout stateful: how a rejected draft is rolled back: "
                        "mask (free; dead entries masked, compacted now and then) or "
                        "trim (copy the state tensors every time) (default: %(default)s)")
    p.add_argument("--cpus", default=D.cpus,
                   help="pin this process to these CPUs, e.g. 0 or 0-1 or 0,2 (lets one box "
                        "emulate two devices: draft on one core, target on the other)")
    p.add_argument("--dtype", default=D.dtype, choices=["float32", "bfloat16", "float16"],
                   help="weight dtype for folder models (default: %(default)s)")
    p.add_argument("--quantize", default=D.quantize, choices=["none", "int8"],
                   help="int8: dynamic int8 quantization of the Linear layers (CPU), a "
                        "cheaper draft; output stays exact because the target verifies "
                        "(default: %(default)s)")
    p.add_argument("--host", default=D.host,
                   help="address to listen on; 0.0.0.0 for all interfaces (default: %(default)s)")
    p.add_argument("--port", type=int, default=default_port,
                   help="port to listen on; 0 picks a free one (default: %(default)s)")
    p.add_argument("--max-sessions", type=int, default=D.max_sessions,
                   help="live sessions (KV caches) held at most; more get RESOURCE_EXHAUSTED "
                        "(default: %(default)s)")
    p.add_argument("--session-ttl", type=float, default=D.session_ttl, metavar="SECONDS",
                   help="idle seconds after which a session is evicted (default: %(default)s)")
    p.add_argument("--max-cached-tokens", type=int, default=D.max_cached_tokens,
                   help="KV-cache budget in positions over all sessions; past it idle sessions "
                        "are evicted (least recently used first), then RESOURCE_EXHAUSTED. "
                        "0 = no budget (default: %(default)s)")
    p.add_argument("--max-draft-tokens", type=int, default=D.max_draft_tokens,
                   help="largest K a request may ask for (default: %(default)s)")
    p.add_argument("--threads", type=int, default=D.threads,
                   help="torch intra-op threads; 0 leaves torch's default (default: %(default)s)")
    p.add_argument("--workers", type=int, default=D.workers,
                   help="gRPC worker threads, also the most concurrent RPCs (more get "
                        "RESOURCE_EXHAUSTED); each waiting request holds one while its steps "
                        "queue for the model (default: %(default)s)")
    p.add_argument("--max-batch-tokens", type=int, default=D.max_batch_tokens,
                   help="continuous batching: most tokens fed in one forward pass; queued "
                        "steps past it wait for the next pass, and a larger prefill runs "
                        "alone, in passes of at most this many tokens (the plugin's "
                        "working memory grows with the largest pass) (default: "
                        "%(default)s)")
    p.add_argument("--batch-linger-ms", type=float, default=D.batch_linger_ms, metavar="MS",
                   help="continuous batching: wait this long for more requests before each "
                        "pass; 0 = never wait, take what is queued (default: %(default)s)")
    p.add_argument("--grace", type=float, default=D.grace, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, seconds in-flight RPCs get to finish "
                        "(default: %(default)s)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=D.warmup,
                   help="before serving, run a throwaway session through every pass size a "
                        "request may bring (1 to --max-draft-tokens + 2 tokens): OpenVINO "
                        "prepares its kernels per input shape on first use, which makes "
                        "the first pass of each size many times slower than the next "
                        "(docs/design.md), and the first client would otherwise wait for "
                        "it (default: on)")
    p.add_argument("--metrics-port", type=int, default=D.metrics_port,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics, on --host; "
                        "0 = off (default: %(default)s)")
    p.add_argument("--health-port", type=int, default=D.health_port,
                   help="also answer grpc.health.v1 (and nothing else) in plaintext on this "
                        "port, on --host: for probes that cannot do (m)TLS, such as "
                        "Kubernetes' gRPC probes; 0 = off (default: %(default)s)")
    p.add_argument("--log-level", default=D.log_level,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(default: %(default)s)")


@functools.cache
def _flag_actions() -> dict[str, argparse.Action]:
    """add_model_service_flags' flags by the field each sets."""
    p = argparse.ArgumentParser(add_help=False)
    add_model_service_flags(p, 0)
    return {a.dest: a for a in p._actions}


def command_line(settings: dict) -> list[str]:
    """The flags that set these ModelServiceConfig fields ({field: value}), spelled as
    add_model_service_flags defines them; ValueError for a name that is not a field."""
    actions = _flag_actions()
    out: list[str] = []
    for name, value in settings.items():
        action = actions.get(name)
        if action is None:
            raise ValueError(f"{name!r} is not a model service setting (ModelServiceConfig)")
        if isinstance(action, argparse.BooleanOptionalAction):
            on, off = action.option_strings
            out.append(on if value else off)
        else:
            out += [action.option_strings[0], str(value)]
    return out
