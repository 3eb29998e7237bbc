"""python -m target_service --model M [--port 50052] ... (see --help)."""

from __future__ import annotations

import logging
import sys

from specdec.grpc_server import SpecdecServer, build_server
from specdec.service_cli import load_cached_model, run, start_metrics
from specdec.tls import server_tls
from target_service import server
from target_service.config import TargetConfig, from_args
from target_service.engine import TargetEngine

log = logging.getLogger("target_service")


def create(cfg: TargetConfig) -> tuple[SpecdecServer, int, TargetEngine]:
    """Check the TLS files (before the slow part), load the model, build the (not yet
    started) server, serve metrics if asked."""
    tls = server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
    engine = TargetEngine(load_cached_model(cfg), cfg.max_draft_tokens)
    engine.grammars.warm()  # structured outputs: the vocabulary, in the background
    precision = engine.model.backend.inference_precision
    if precision != "f32":
        log.warning("the target computes in %s: verifying several tokens at once rounds "
                    "differently from one-token steps, so greedy speculative output can "
                    "differ from target-only output (measured: it does on SmolLM2 in bf16); "
                    "--inference-precision f32 keeps them identical", precision)
    grpc_server, port = build_server(cfg.address, [server.service(engine)],
                                     max_workers=cfg.workers, tls=tls)
    start_metrics("target", cfg, engine.model)
    return grpc_server, port, engine


def main(argv: list[str] | None = None) -> int:
    return run("target", from_args(argv), create)


if __name__ == "__main__":
    sys.exit(main())
