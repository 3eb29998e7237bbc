"""The drafts `specdec tune-skip` can tune for, each as (a model to score agreement
with, backends to time).

Agreement is computed in torch (one pass per sequence, any skip set without an export).
For an OpenVINO int8 draft the torch weights are rounded the way its export stores them:
8-bit asymmetric, one scale and zero point per output channel (nncf's int8 weight
compression, what `OVWeightQuantizationConfig(bits=8)` asks for), so the model predicts
what the served draft predicts up to the runtime's own arithmetic. Timing runs on the
real backends (specdec_tools.skip_tune.timing).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

DRAFTS = ("ov-int8", "ov-fp32", "torch-int8", "torch-fp32")


@torch.no_grad()
def round_weights_int8(model) -> None:
    """Every nn.Linear and embedding weight rounded to int8 asymmetric per output channel
    (rows), in place and kept in float32."""
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            w = module.weight
            lo = w.amin(dim=1, keepdim=True).clamp(max=0)
            hi = w.amax(dim=1, keepdim=True).clamp(min=0)
            scale = ((hi - lo) / 255).clamp(min=1e-12)
            zero = torch.round(-lo / scale)
            q = torch.clamp(torch.round(w / scale) + zero, 0, 255)
            w.copy_((q - zero) * scale)


@dataclass
class Setup:
    scored: object  # LoadedModel whose agreement stands for the draft's
    draft_full: object  # backend: the draft at full depth, for its step time
    target: object  # backend: the target, for its step and verify times
    vocab: int


def scored_model(kind: str, target):
    """The model whose agreement stands for draft `kind`'s (a LoadedModel): `target`
    itself for fp32, a copy with its weights rounded as the draft's are for int8."""
    from specdec.runtime import models

    if kind not in DRAFTS:
        raise ValueError(f"draft must be one of {', '.join(DRAFTS)}, got {kind!r}")
    backend, weights = kind.split("-")
    if weights != "int8":
        return target
    scored = copy.deepcopy(target)
    if backend == "torch":
        models.quantize_int8(scored)
    else:
        round_weights_int8(scored.model)
    return scored


def build(kind: str, target, model: str, threads: int) -> Setup:
    """`target` is the loaded fp32 model (LoadedModel); `model` its --model name."""
    from specdec.runtime.torch_backend import TorchBackend

    scored = scored_model(kind, target)
    backend, weights = kind.split("-")
    if backend == "torch":
        return Setup(scored, TorchBackend(scored), TorchBackend(target), target.vocab_size)
    from specdec.runtime.openvino_backend import OpenVINOBackend
    from specdec.runtime.openvino_export import resolve_ir

    def ov(w: str) -> OpenVINOBackend:
        ir, _ = resolve_ir(model, w)
        return OpenVINOBackend(ir, "CPU", threads, compressed_weights=w != "fp32")

    return Setup(scored, ov(weights), ov("fp32"), target.vocab_size)
