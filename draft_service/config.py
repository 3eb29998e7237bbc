"""Draft service configuration and its command-line flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from specdec.runtime import layer_skip
from specdec.sampling import DEFAULT_TOP_N
from specdec.service_cli import ModelServiceConfig, add_model_service_flags
from specdec.tls import ServerTLSFields, add_server_tls_flags

DEFAULT_PORT = 50051


@dataclass
class DraftConfig(ServerTLSFields, ModelServiceConfig):
    port: int = DEFAULT_PORT
    top_n: int = DEFAULT_TOP_N
    # A draft's precision never changes the output, only its speed. f32: on the AMX CPUs
    # measured (oneDNN capped at AVX-512 BF16), the int8 draft steps in 24.7 ms in f32
    # against 25.1 ms in bf16 alone, and 37.7 against 63.7 ms for a batch of 8.
    inference_precision: str = "f32"
    skip_layers: tuple[int, ...] = ()  # a self-speculative draft: the target minus these


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m draft_service",
        description="specdec draft service: proposes K tokens per request, with the exact "
                    "sparse distributions it sampled them from (gRPC specdec.v1.DraftService).",
    )
    add_model_service_flags(p, DEFAULT_PORT, default_precision="f32")
    p.add_argument("--top-n", type=int, default=DEFAULT_TOP_N,
                   help="size of the sparse q sent per drafted token when a request says 0; "
                        "smaller = fewer bytes, slightly lower acceptance (default: %(default)s)")
    p.add_argument("--skip-layers", type=layer_skip.arg, default=(), metavar="SET",
                   help="serve the model with these decoder layers skipped, a "
                        "self-speculative draft (Draft & Verify; specdec.runtime.layer_skip): "
                        "0-based indices and ranges, e.g. 3,5,7 or 2-4,9, or @FILE to read "
                        "them from a file (what specdec tune-skip writes); the OpenVINO "
                        "backend needs an IR exported for the set (specdec prepare "
                        "--skip-layers SET); default: none")
    add_server_tls_flags(p)
    return p



def from_args(argv: list[str] | None = None) -> DraftConfig:
    ns = parser().parse_args(argv)
    return DraftConfig(**{f.name: getattr(ns, f.name) for f in fields(DraftConfig)})
