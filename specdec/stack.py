"""Draft, target and coordinator as child processes on loopback (`specdec up`, demo)."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass

from specdec import launcher

log = logging.getLogger(__name__)


@dataclass
class StackConfig:
    target_model: str = "smollm2-135m"
    draft_model: str = "smollm2-135m"
    # The best lossless torch draft measured for SmolLM2 (see README): int8 dynamic quant.
    draft_args: tuple[str, ...] = ("--quantize", "int8")
    target_args: tuple[str, ...] = ()
    k: int = 4
    draft_port: int = 50051
    target_port: int = 50052
    port: int = 50050
    # One core each: on a 2-core box this beats both sharing all cores (measured).
    threads: int = 1  # torch threads per model service; 0 = torch default (all cores)
    no_draft: bool = False


@dataclass
class Stack:
    draft: launcher.ServiceProcess | None
    target: launcher.ServiceProcess
    coordinator: launcher.ServiceProcess

    @property
    def address(self) -> str:
        return self.coordinator.address


def start(cfg: StackConfig, stack: ExitStack, echo: bool = False) -> Stack:
    """Start all three; each is stopped (SIGTERM) when `stack` closes."""
    def run(name, module, args, timeout=300):
        log.info("starting %s ...", name)
        proc = launcher.start(module, args, timeout=timeout, echo=echo, name=name)
        stack.callback(proc.stop)
        log.info("%s ready at %s", name, proc.address)
        return proc

    threads = ["--threads", str(cfg.threads)] if cfg.threads else []
    target = run("target", "target_service", ["--model", cfg.target_model,
                                              "--port", str(cfg.target_port), *threads,
                                              *cfg.target_args])
    draft = None
    if not cfg.no_draft:
        draft = run("draft", "draft_service", ["--model", cfg.draft_model,
                                               "--port", str(cfg.draft_port), *threads,
                                               *cfg.draft_args])
    coord_args = ["--target", target.address, "--port", str(cfg.port), "--k", str(cfg.k)]
    if draft:
        coord_args += ["--draft", draft.address]
    coordinator = run("coordinator (Ray Serve)", "coordinator", coord_args)
    return Stack(draft, target, coordinator)
