"""Target service configuration and its command-line flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from specdec.service_config import ModelServiceConfig, add_model_service_flags
from specdec.tls import ServerTLSFields, add_server_tls_flags

DEFAULT_PORT = 50052


@dataclass
class TargetConfig(ServerTLSFields, ModelServiceConfig):
    port: int = DEFAULT_PORT


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m target_service",
        description="specdec target service: verifies K drafted tokens in one forward pass "
                    "(gRPC specdec.v1.TargetService).",
    )
    add_model_service_flags(p, TargetConfig().port)
    add_server_tls_flags(p)
    return p


def from_args(argv: list[str] | None = None) -> TargetConfig:
    ns = parser().parse_args(argv)
    return TargetConfig(**{f.name: getattr(ns, f.name) for f in fields(TargetConfig)})
