"""Draft service configuration and its command-line flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from specdec.runtime import layer_skip
from specdec.runtime.fr_vocab import head_vocab_arg
from specdec.sampling import DEFAULT_TOP_MASS, DEFAULT_TOP_N
from specdec.service_config import ModelServiceConfig, add_model_service_flags
from specdec.tls import ServerTLSFields, add_server_tls_flags

DEFAULT_PORT = 50051


@dataclass
class DraftConfig(ServerTLSFields, ModelServiceConfig):
    port: int = DEFAULT_PORT
    top_n: int = DEFAULT_TOP_N
    top_mass: float = DEFAULT_TOP_MASS
    # A draft's precision never changes the output, only its speed. f32: on the AMX CPUs
    # measured (oneDNN capped at AVX-512 BF16), the int8 draft steps no slower in f32 than
    # in bf16 alone and much faster in a batch (measured: docs/benchmarks.md, "Figures
    # behind the code's choices").
    inference_precision: str = "f32"
    skip_layers: tuple[int, ...] = ()  # a self-speculative draft: the target minus these
    skip_on_the_fly: tuple[int, ...] = ()  # ranked layers an on-the-fly draft may skip
    skip_max: int = -1  # at most this many of them; -1 = all
    skip_window: int = 16  # rounds per on-the-fly decision
    head_vocab: int = 0  # FR-Spec: an LM head of the N top-ranked tokens; 0 = the full head


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m draft_service",
        description="specdec draft service: proposes K tokens per request, with the exact "
                    "sparse distributions it sampled them from (gRPC specdec.v1.DraftService).",
    )
    d = DraftConfig()  # every default is its field's
    add_model_service_flags(p, d.port, default_precision=d.inference_precision)
    p.add_argument("--top-n", type=int, default=d.top_n,
                   help="size of the sparse q sent per drafted token when a request says 0; "
                        "smaller = fewer bytes, slightly lower acceptance (default: %(default)s)")
    p.add_argument("--top-mass", type=mass, default=d.top_mass,
                   help="keep only the fewest most likely tokens holding this much of the "
                        "mass in each sparse q (at most --top-n of them) when a request "
                        "says 0; in (0, 1], 1 = always --top-n; smaller = fewer bytes, "
                        "slightly lower acceptance (default: %(default)s)")
    p.add_argument("--skip-layers", type=layer_skip.arg, default=d.skip_layers, metavar="SET",
                   help="serve the model with these decoder layers skipped, a "
                        "self-speculative draft (Draft & Verify; specdec.runtime.layer_skip): "
                        "0-based indices and ranges, e.g. 3,5,7 or 2-4,9, or @FILE to read "
                        "them from a file (what specdec tune-skip writes); the OpenVINO "
                        "backend needs an IR exported for the set (specdec prepare "
                        "--skip-layers SET); default: none")
    p.add_argument("--skip-on-the-fly", type=layer_skip.order_arg, default=d.skip_on_the_fly,
                   metavar="ORDER",
                   help="choose the skip set during generation (torch backend): skip the "
                        "first m layers of this ranked list, m chosen from the rounds' "
                        "observed tokens per second (draft_service.skip_climb; SWIFT), "
                        "e.g. 12,25,3 or @FILE (specdec tune-skip writes <study>.order); "
                        "default: off")
    p.add_argument("--skip-max", type=int, default=d.skip_max,
                   help="with --skip-on-the-fly: skip at most this many layers (default: "
                        "the whole list)")
    p.add_argument("--skip-window", type=int, default=d.skip_window,
                   help="with --skip-on-the-fly: rounds between decisions; each decision "
                        "moves m by at most one (default: %(default)s)")
    p.add_argument("--head-vocab", type=head_vocab_arg, default=d.head_vocab, metavar="N",
                   help="FR-Spec (Zhao et al. 2025): serve the draft with an LM head of only "
                        "the N tokens the model generates most (ranked on its own answers "
                        "to a fixed prompt set), a cheaper output layer; tokens outside it "
                        "are never proposed, the target still verifies over the whole "
                        "vocabulary, so the output is unchanged. Needs --backend openvino "
                        "and an IR exported with that head (specdec prepare --openvino "
                        "--weights WEIGHTS --head-vocab N; tiny models are exported on the "
                        "fly); `specdec bench-draft-head` measures N. 0 = the full head "
                        "(default: %(default)s)")
    add_server_tls_flags(p)
    return p



def mass(text: str) -> float:
    """--top-mass: a float in (0, 1]."""
    value = float(text)
    if not 0.0 < value <= 1.0:  # False for NaN
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def from_args(argv: list[str] | None = None) -> DraftConfig:
    ns = parser().parse_args(argv)
    return DraftConfig(**{f.name: getattr(ns, f.name) for f in fields(DraftConfig)})
