"""Draft service configuration and its command-line flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from specdec.sampling import DEFAULT_TOP_N
from specdec.service_cli import ModelServiceConfig, add_model_service_flags

DEFAULT_PORT = 50051


@dataclass
class DraftConfig(ModelServiceConfig):
    port: int = DEFAULT_PORT
    top_n: int = DEFAULT_TOP_N
    inference_precision: str = "auto"  # a draft's precision never changes the output


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m draft_service",
        description="specdec draft service: proposes K tokens per request, with the exact "
                    "sparse distributions it sampled them from (gRPC specdec.v1.DraftService).",
    )
    add_model_service_flags(p, DEFAULT_PORT, default_precision="auto")
    p.add_argument("--top-n", type=int, default=DEFAULT_TOP_N,
                   help="size of the sparse q sent per drafted token when a request says 0; "
                        "smaller = fewer bytes, slightly lower acceptance (default: %(default)s)")
    return p


def from_args(argv: list[str] | None = None) -> DraftConfig:
    ns = parser().parse_args(argv)
    return DraftConfig(**{f.name: getattr(ns, f.name) for f in fields(DraftConfig)})
