"""Draft, target and coordinator as child processes on loopback (`specdec up`, demo)."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass

from coordinator.policy import DEFAULT_POLICY
from specdec import launcher
from specdec import pair as pairs

log = logging.getLogger(__name__)


@dataclass
class StackConfig:
    pair: pairs.Pair = pairs.DEFAULT_PAIR  # model, backend, weights, threads of each service
    k: int = DEFAULT_POLICY.k  # the coordinator's defaults (coordinator.policy)
    draft_port: int = 50051
    target_port: int = 50052
    port: int = 50050
    http_port: int = 8000  # the OpenAI-compatible HTTP API and /demo (0 = not exposed)
    pin: bool = True  # specdec.pair.placement(): draft on the first CPU, target on the second
    pipeline: bool = DEFAULT_POLICY.pipeline
    no_draft: bool = False


@dataclass
class Stack:
    draft: launcher.ServiceProcess | None
    target: launcher.ServiceProcess
    coordinator: launcher.ServiceProcess
    http_port: int = 0

    @property
    def address(self) -> str:
        return self.coordinator.address

    @property
    def http_url(self) -> str | None:
        """The HTTP API's base URL (None when it is not exposed)."""
        host = self.address.rsplit(":", 1)[0]
        return f"http://{host}:{self.http_port}" if self.http_port > 0 else None


def start(cfg: StackConfig, stack: ExitStack, echo: bool = False) -> Stack:
    """Start all three; each is stopped (SIGTERM) when `stack` closes."""
    running = pairs.start(cfg.pair, stack, pin=cfg.pin, target_port=cfg.target_port,
                          draft_port=cfg.draft_port, with_draft=not cfg.no_draft, echo=echo)
    coord_args = ["--target", running.target.address, "--port", str(cfg.port),
                  "--http-port", str(cfg.http_port),
                  "--k", str(cfg.k), "--pipeline" if cfg.pipeline else "--no-pipeline"]
    if running.draft:
        coord_args += ["--draft", running.draft.address]
    log.info("starting coordinator (Ray Serve) ...")
    coordinator = launcher.start("coordinator", coord_args, timeout=300, echo=echo,
                                 name="coordinator (Ray Serve)")
    stack.callback(coordinator.stop)
    log.info("coordinator ready at %s", coordinator.address)
    return Stack(running.draft, running.target, coordinator, cfg.http_port)
