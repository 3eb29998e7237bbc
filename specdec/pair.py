"""The draft/target pair and the one place that turns it into service command lines.

A `ServiceSpec` is a role and the settings of specdec.service_config.ModelServiceConfig it
runs with (model, backend, weights, threads, inference precision: the same names), plus
any further flags; `.args(port, cpus)` is its command line, spelled by
specdec.service_config.command_line. A `Pair` is a
target spec and a draft spec; `DEFAULT_PAIR` is what `specdec up`, `specdec demo`, the
bench, the tests and the k8s manifests run; `CANDIDATES` are the pairs `specdec
bench-pairs` compares, built from it. `placement()` is the one CPU placement rule and
`start()` starts a pair as processes.
"""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass, replace

from specdec import launcher
from specdec.paths import QWEN_CODER_DRAFT, QWEN_CODER_TARGET

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceSpec:
    role: str  # "target" or "draft"
    model: str = "smollm2-135m"
    backend: str | None = "openvino"  # None = the service's default (no flag)
    weights: str | None = "fp32"  # OpenVINO IR weights; None = no flag
    threads: int = 1  # 0 = the runtime's default (no flag)
    inference_precision: str | None = None  # None = the service's default (no flag)
    extra: tuple[str, ...] = ()  # further flags, appended as given

    @property
    def module(self) -> str:
        return f"{self.role}_service"

    def _model_settings(self) -> dict:
        """What the service computes with, where set: backend, weights, precision."""
        return {name: value for name, value in (
            ("backend", self.backend), ("weights", self.weights),
            ("inference_precision", self.inference_precision)) if value}

    def model_flags(self) -> list[str]:
        """What the service computes with: backend, weights, precision and the extras."""
        from specdec.service_config import command_line

        return command_line(self._model_settings()) + list(self.extra)

    def args(self, port: int = 0, cpus: str | int | None = None) -> list[str]:
        """The service's command line (after `python -m <module>`)."""
        from specdec.service_config import command_line

        settings = {"model": self.model, "port": port}
        if self.threads:
            settings["threads"] = self.threads
        if cpus is not None and cpus != "":
            settings["cpus"] = cpus
        return command_line({**settings, **self._model_settings()}) + list(self.extra)

    def with_(self, **changes) -> ServiceSpec:
        return replace(self, **changes)


@dataclass(frozen=True)
class Pair:
    name: str
    target: ServiceSpec
    draft: ServiceSpec

    def with_models(self, target: str | None = None, draft: str | None = None) -> Pair:
        return replace(self, target=self.target.with_(model=target or self.target.model),
                       draft=self.draft.with_(model=draft or self.draft.model))

    def with_amateur(self) -> Pair:
        """The pair with its draft able to serve contrastive decoding as the amateur:
        OpenVINO's dynamic quantization off, so that its logits depend on the prefix
        alone (docs/design.md, section 17)."""
        return replace(self, name=f"{self.name}, dynamic quantization off",
                       draft=self.draft.with_(
                           extra=self.draft.extra + ("--dynamic-quantization", "off")))

    def with_threads(self, threads: int) -> Pair:
        return replace(self, target=self.target.with_(threads=threads),
                       draft=self.draft.with_(threads=threads))


# The default pair, chosen by `specdec bench-pairs` (figures in the README): OpenVINO fp32
# target and OpenVINO int8 draft, one thread each.
DEFAULT_PAIR = Pair("ov-fp32 target + ov-int8 draft",
                    ServiceSpec("target", backend="openvino", weights="fp32"),
                    ServiceSpec("draft", backend="openvino", weights="int8"))

# The default pair with an amateur for contrastive decoding: the same int8 draft with
# OpenVINO's dynamic quantization off, so that its logits depend on the prefix alone
# (docs/design.md, section 17). Not the default: off, the int8 draft's passes cost more,
# batched passes and prefills most (measured: docs/design.md, section 17).
CONTRASTIVE_PAIR = DEFAULT_PAIR.with_amateur()


# The Qwen2.5-Coder pair (`specdec prepare --pair qwen2.5-coder`, specdec.model_pairs,
# which exports each model at the weights given here): int8 target, int4 draft, with
# the CPU plugin's dynamic quantization of activations on (the paged backend keeps
# logits independent of the pass: specdec.runtime.openvino_paged._infer; off, int8
# weights cost a full weight read per verified token; docs/design.md section 28).
# The draft keeps its KV cache in f16: half the f32 pool, a 11% shorter step (28.0
# against 31.4 ms), the same greedy agreement with the target on the held-out prompts
# (0.904 code, 0.688 chat; u8 fell to 0.71 and 0.49); docs/design.md section 28.
# Its passes hold at most 512 tokens: the plugin keeps working memory for the largest
# pass it ran, and 2,048-token passes left the draft ~240 MiB over passes of 512
# (which prefill as fast per token).
# The target quantizes its activations in groups of 128, not the plugin's 32: verify
# rows cost 12-24% less (4 x 5 and 16 x 5 tokens), and its greedy tokens agree with
# the same int8 model's without activation quantization on 0.9948 of 2,310 held-out
# and tuning positions, against 0.9970 in groups of 32 (docs/design.md section 28).
QWEN_CODER_PAIR = Pair("qwen2.5-coder: ov-int8 target + ov-int4 draft",
                       ServiceSpec("target", QWEN_CODER_TARGET, weights="int8",
                                   extra=("--dynamic-quantization", "128")),
                       ServiceSpec("draft", QWEN_CODER_DRAFT, weights="int4",
                                   extra=("--kv-cache-precision", "f16",
                                          "--max-batch-tokens", "512")))
# What `specdec up --pair NAME` and `make demo PAIR=NAME` serve.
SERVED = {"smollm2": DEFAULT_PAIR, "qwen2.5-coder": QWEN_CODER_PAIR}

_TORCH_TARGET = DEFAULT_PAIR.target.with_(backend="torch", weights=None)
CANDIDATES = [
    DEFAULT_PAIR,
    Pair("ov-fp32 target + ov-int4 draft", DEFAULT_PAIR.target,
         DEFAULT_PAIR.draft.with_(weights="int4")),
    Pair("torch-fp32 target + ov-int8 draft", _TORCH_TARGET, DEFAULT_PAIR.draft),
    Pair("torch-fp32 target + torch-int8 draft", _TORCH_TARGET,
         DEFAULT_PAIR.draft.with_(backend="torch", weights=None, extra=("--quantize", "int8"))),
]

# The tiny models (built in-process from fixed seeds) on torch, for tests.
TINY_PAIR = Pair("tiny torch pair",
                 ServiceSpec("target", "tiny-random", backend=None, weights=None, threads=0),
                 ServiceSpec("draft", "tiny-random-draft", backend=None, weights=None,
                             threads=0))


def placement(pin: bool = True) -> dict[str, int | None]:
    """The one CPU placement rule: the draft on the first CPU of this process's affinity,
    the target on the second, only when there are at least two (and `pin`); otherwise
    both unpinned (None). {"draft": cpu, "target": cpu}."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return {"draft": None, "target": None}
    return {"draft": cpus[0], "target": cpus[1]}


@dataclass
class RunningPair:
    target: launcher.ServiceProcess
    draft: launcher.ServiceProcess | None
    cpus: dict[str, int | None]

    @property
    def pinned(self) -> bool:
        return self.cpus["target"] is not None

    def processes(self) -> dict[str, launcher.ServiceProcess]:
        return {"target": self.target, **({"draft": self.draft} if self.draft else {})}


def start(pair: Pair, stack: ExitStack, *, pin: bool = True, target_port: int = 0,
          draft_port: int = 0, with_draft: bool = True, echo: bool = False,
          timeout: float = 300.0) -> RunningPair:
    """Start the pair's target (then draft) as processes placed by `placement(pin)`; each
    is stopped (SIGTERM) when `stack` closes."""
    cpus = placement(pin)
    if cpus["target"] is not None:
        log.info("pinning the draft to CPU %d and the target to CPU %d", cpus["draft"],
                 cpus["target"])

    def run(spec: ServiceSpec, port: int) -> launcher.ServiceProcess:
        log.info("starting %s ...", spec.role)
        proc = launcher.start(spec.module, spec.args(port, cpus[spec.role]), timeout=timeout,
                              echo=echo, name=spec.role)
        stack.callback(proc.stop)
        log.info("%s ready at %s", spec.role, proc.address)
        return proc

    target = run(pair.target, target_port)
    draft = run(pair.draft, draft_port) if with_draft else None
    return RunningPair(target, draft, cpus)
