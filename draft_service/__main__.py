"""python -m draft_service --model M [--port 50051] ... (see --help)."""

from __future__ import annotations

import sys

from draft_service import server
from draft_service.config import DraftConfig, from_args
from draft_service.engine import DraftEngine
from specdec.grpc_server import SpecdecServer, build_server
from specdec.service_cli import load_cached_model, run, start_metrics
from specdec.tls import server_tls


def create(cfg: DraftConfig) -> tuple[SpecdecServer, int, DraftEngine]:
    """Check the TLS files (before the slow part), load the model, build the (not yet
    started) server, serve metrics if asked."""
    tls = server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)
    model = load_cached_model(cfg)
    # the target's exactness needs pass-independent logits; a draft's speed does not
    model.backend.one_token_rows = False
    engine = DraftEngine(model, cfg.max_draft_tokens, cfg.top_n,
                         climber=skip_climber(cfg, model), default_top_mass=cfg.top_mass)
    engine.grammars.warm()  # structured outputs: the vocabulary, in the background
    grpc_server, port = build_server(cfg.address, [server.service(engine)],
                                     max_workers=cfg.workers, tls=tls)
    start_metrics("draft", cfg, engine.model)
    return grpc_server, port, engine


def skip_climber(cfg: DraftConfig, model):
    """The on-the-fly skip climber --skip-on-the-fly asks for, else None. By default it
    may skip the whole order but one layer of the model."""
    if not cfg.skip_on_the_fly:
        return None
    from draft_service.skip_climb import SkipClimber

    order = cfg.skip_on_the_fly
    most = min(len(order), model.backend.dynamic_skip.num_layers - 1)
    return SkipClimber(order, most if cfg.skip_max < 0 else cfg.skip_max,
                      window=cfg.skip_window)


def main(argv: list[str] | None = None) -> int:
    return run("draft", from_args(argv), create)


if __name__ == "__main__":
    sys.exit(main())
