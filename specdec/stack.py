"""Draft, target and coordinator as child processes on loopback (`specdec up`, demo)."""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass

from specdec import launcher

log = logging.getLogger(__name__)


# The default pair, chosen by `specdec bench-pairs` (README, "Performance"): OpenVINO fp32
# target and OpenVINO int8 draft, each on its own core when there are two.
TARGET_ARGS = ("--backend", "openvino", "--weights", "fp32")
DRAFT_ARGS = ("--backend", "openvino", "--weights", "int8")


@dataclass
class StackConfig:
    target_model: str = "smollm2-135m"
    draft_model: str = "smollm2-135m"
    draft_args: tuple[str, ...] = DRAFT_ARGS  # extra flags for the draft service
    target_args: tuple[str, ...] = TARGET_ARGS
    k: int = 4
    draft_port: int = 50051
    target_port: int = 50052
    port: int = 50050
    threads: int = 1  # threads per model service; 0 = the runtime's default
    pin: bool = True  # draft on CPU 0, target on CPU 1 (when the machine has two)
    pipeline: bool = True  # pipelined drafting in the coordinator
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
    pin = cfg.pin and len(os.sched_getaffinity(0)) >= 2
    cpus = sorted(os.sched_getaffinity(0))
    if pin:
        log.info("pinning the draft to CPU %d and the target to CPU %d", cpus[0], cpus[1])
    target = run("target", "target_service", [
        "--model", cfg.target_model, "--port", str(cfg.target_port), *threads,
        *(["--cpus", str(cpus[1])] if pin else []), *cfg.target_args])
    draft = None
    if not cfg.no_draft:
        draft = run("draft", "draft_service", [
            "--model", cfg.draft_model, "--port", str(cfg.draft_port), *threads,
            *(["--cpus", str(cpus[0])] if pin else []), *cfg.draft_args])
    coord_args = ["--target", target.address, "--port", str(cfg.port), "--k", str(cfg.k)]
    if cfg.pipeline:
        coord_args.append("--pipeline")
    if draft:
        coord_args += ["--draft", draft.address]
    coordinator = run("coordinator (Ray Serve)", "coordinator", coord_args)
    return Stack(draft, target, coordinator)
