"""The OpenVINO backend: a stateful IR (optimum-intel export), one infer request per session.

A stateful IR keeps its KV cache inside the infer request, with no crop. Two rollback
strategies:

* ``mask`` (default): rejected entries stay in the state and are masked out with the
  attention mask; positions come from explicit position_ids, so later tokens get the
  right rotary positions. A rollback costs nothing; once `max_stale` dead entries have
  piled up, the state is compacted (one gather, amortized over many rollbacks).
* ``trim``: every rollback gathers the live entries of each state tensor and sets it
  back (query_state / set_state): O(context) per rollback.

Each session owns an infer request, so sessions never see each other's caches;
requests share the compiled model (weights are not copied).

Same interface as TorchBackend: new_cache / cache_len / crop / forward.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdec.runtime import lean_tokenizer
from specdec.runtime.backend import BackendDefaults
from specdec.runtime.fr_head import HeadMap
from specdec.runtime.models import LoadedModel

log = logging.getLogger(__name__)

IR_FILE = "openvino_model.xml"
KV_PRECISIONS = ("f32", "f16", "u8")


ROLLBACKS = ("mask", "trim")
# oneDNN's ISA cap, read once, at the process's first compile.
ISA_CAP_VAR, ISA_CAP = "ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16"
# auto = the plugin's default: bf16 on CPUs with native bf16 (AVX-512 BF16, AMX), else f32.
PRECISIONS = ("auto", "f32", "bf16", "f16")


@dataclass
class OVCache:
    request: object  # openvino.InferRequest holding this session's KV states
    length: int = 0  # live positions (what the session holds logically)
    # One flag per physical entry of the state: 1 = live, 0 = rolled back (masked out).
    live: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def cap_cpu_isa_below_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Keep OpenVINO's CPU plugin off AMX; True when this call set the cap.

    OpenVINO 2026.4's CPU plugin dies with SIGFPE inside compile_model when it compiles
    an uncompressed (fp32) IR for bf16 on one thread of a CPU with AMX (measured on
    SmolLM2 and the tiny test model; openvinotoolkit/openvino#33300 reports the same
    with fp16 weights on one core). Capping oneDNN at AVX-512 BF16 avoids it, with no
    step-time difference measured on SmolLM2 (docs/design.md, "Pitfalls"). oneDNN reads
    the cap at the process's first compile, so every compile path calls this first. A
    cap the user set wins.
    """
    if ISA_CAP_VAR in os.environ:
        return False
    try:
        with open(cpuinfo) as f:
            has_amx = any(line.startswith("flags") and " amx_bf16" in line for line in f)
    except OSError:
        return False
    if has_amx:
        os.environ[ISA_CAP_VAR] = ISA_CAP
        log.info("CPU has AMX: capping oneDNN at %s (%s) to avoid an OpenVINO crash on "
                 "one-thread bf16 compiles", ISA_CAP, ISA_CAP_VAR)
    return has_amx


def _weights_of(matmul) -> bool:
    """Whether the MatMul's second input is a weight: a Constant, through the ops of a
    decompression (NNCF's int8/int4: Convert, Subtract, Multiply, Reshape)."""
    node = matmul.input_value(1).get_node()
    while node.get_type_name() in ("Convert", "Subtract", "Multiply", "Reshape", "Transpose"):
        node = node.input_value(0).get_node()
    return node.get_type_name() == "Constant"


def check_quantization_group(model, group: int) -> None:
    """ValueError unless `group` (the plugin's activation quantization group; 0: its
    default) divides the input width of every MatMul. A group that does not made a
    position's logits depend on its pass again, one-token rows or not (measured on a
    model 64 wide at 128); Qwen2.5-Coder-1.5B's widths (1,536, 8,960) take 128."""
    if group <= 0:
        return
    widths = set()
    for op in model.get_ops():
        if op.get_type_name() == "MatMul" and _weights_of(op):
            shape = op.input_value(0).get_partial_shape()
            if shape.rank.is_static and shape[shape.rank.get_length() - 1].is_static:
                widths.add(shape[shape.rank.get_length() - 1].get_length())
    bad = sorted(w for w in widths if w % group)
    if bad:
        raise ValueError(f"--dynamic-quantization {group} does not divide this model's "
                         f"matmul widths {bad}: choose a group size that does (or auto)")


class OpenVINOBackend(BackendDefaults):
    name = "openvino"

    def __init__(self, ir_dir: str | Path, device: str = "CPU", threads: int = 0,
                 kv_cache_precision: str = "f32", performance_hint: str = "LATENCY",
                 model_id: str | None = None, rollback: str = "mask", max_stale: int = 64,
                 inference_precision: str = "f32", dynamic_quantization: bool = True,
                 compressed_weights: bool = False, dynamic_quantization_group: int = 0):
        import openvino as ov

        cap_cpu_isa_below_amx()
        ir_dir = Path(ir_dir)
        core = ov.Core()
        if device.split(":")[0].split(".")[0] not in ("AUTO", "HETERO", "MULTI") and \
                device not in core.available_devices and device.split(".")[0] not in \
                {d.split(".")[0] for d in core.available_devices}:
            raise ValueError(f"OpenVINO device {device!r} is not available here "
                             f"(available: {', '.join(core.available_devices)})")
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {ROLLBACKS}, got {rollback!r}")
        self.rollback, self.max_stale = rollback, max_stale
        if kv_cache_precision not in KV_PRECISIONS:
            raise ValueError(f"kv cache precision must be one of {KV_PRECISIONS}")
        if inference_precision not in PRECISIONS:
            raise ValueError(f"inference precision must be one of {PRECISIONS}")
        config = {"KV_CACHE_PRECISION": kv_cache_precision}
        if inference_precision != "auto":
            config["INFERENCE_PRECISION_HINT"] = inference_precision
        if device.startswith("CPU"):
            # Pinning fights with a second process on the same cores; use --cpus instead.
            config["ENABLE_CPU_PINNING"] = False
        if threads > 0:
            config["INFERENCE_NUM_THREADS"] = threads
        if performance_hint:
            config["PERFORMANCE_HINT"] = performance_hint
        if not dynamic_quantization:
            # The CPU plugin quantizes activations (groups of 32) in passes of more than
            # one token over int8/int4 weights; off, a position's logits depend on its
            # prefix alone, whatever the pass holds (contrastive decoding's amateur).
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
        elif dynamic_quantization_group > 0:  # 0: the plugin's default (32 on CPU)
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = dynamic_quantization_group
        self.batch_dependent_logits = compressed_weights and dynamic_quantization
        self.compiled = self._compile(core, ir_dir / IR_FILE, device, config)
        self.weights_file = (ir_dir / IR_FILE).with_suffix(".bin")
        try:  # what the plugin resolved "auto" to, for logs and bench reports
            self.inference_precision = \
                self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        except Exception:  # noqa: BLE001 - not every plugin reports it
            self.inference_precision = inference_precision
        hf_config = json.loads((ir_dir / "config.json").read_text())
        known = lean_tokenizer.facts(ir_dir)  # the tokenizer itself loads if asked
        tokenizer = lean_tokenizer.LazyTokenizer(ir_dir, known)
        self.vocab_size = int(hf_config["vocab_size"])
        # An FR-Spec draft's IR computes only its head's rows (specdec.runtime.fr_head);
        # forward scatters them back into full-vocabulary rows, -inf elsewhere.
        self.head = HeadMap.load(ir_dir, self.vocab_size)
        self.head_vocab = self.head.size if self.head is not None else 0
        self._check_head_width(ir_dir)
        self.max_context = int(hf_config.get("max_position_embeddings", 2048))
        self.loaded = LoadedModel(None, model_id or ir_dir.name, self.vocab_size,
                                  known.digest, self.max_context, tokenizer)
        self.device = device
        self._inputs = {i.get_any_name() for i in self.compiled.inputs}
        self._seq_axis: int | None = None
        self._lock = threading.Lock()

    def _compile(self, core, xml: Path, device: str, config: dict):
        return core.compile_model(self._read_model(core, xml, config), device, config)

    @staticmethod
    def _read_model(core, xml: Path, config: dict):
        """The IR's model, refused if its matmuls do not take the activation group the
        config asks for (check_quantization_group)."""
        model = core.read_model(str(xml))
        check_quantization_group(model, config.get("DYNAMIC_QUANTIZATION_GROUP_SIZE", 0))
        return model

    def release_mapped_weights(self) -> int:
        """After the passes that made the plugin repack its weights (a warm-up), drop
        the IR file's mapped pages from RSS (specdec.runtime.mapped_weights); bytes."""
        from specdec.runtime import mapped_weights

        return mapped_weights.release(self.weights_file)

    def _check_head_width(self, ir_dir: Path) -> None:
        if self.head is None:
            return
        width = self.compiled.output("logits").get_partial_shape()[-1]
        if width.is_static and width.get_length() != self.head.size:
            raise ValueError(f"{ir_dir}: the IR's logits have {width.get_length()} columns "
                             f"but its head_ids.json lists {self.head.size} ids")

    def _rows(self, logits) -> torch.Tensor:
        """The IR's logits rows [n, width] as float32 [n, vocab_size] (a sliced head's
        scattered back, -inf outside it)."""
        if self.head is not None:
            return self.head.expand(logits)
        return torch.from_numpy(np.array(logits, dtype=np.float32))

    def new_cache(self) -> OVCache:
        with self._lock:  # create_infer_request is cheap but not documented thread-safe
            return OVCache(self.compiled.create_infer_request())

    @staticmethod
    def cache_len(cache: OVCache) -> int:
        return cache.length

    def _find_seq_axis(self, shape, length: int) -> int:
        """KV states are [batch, heads, seq, head_dim] in optimum's exports; check once."""
        if self._seq_axis is None:
            axes = [i for i, n in enumerate(shape) if n == length]
            self._seq_axis = 2 if 2 in axes or not axes else axes[-1]
        return self._seq_axis

    def _reset(self, cache: OVCache) -> None:
        cache.request.reset_state()
        cache.live = np.zeros(0, dtype=np.int64)
        cache.length = 0

    def _compact(self, cache: OVCache) -> None:
        """Keep only the live entries of every state tensor (one gather each)."""
        import openvino as ov

        keep = np.flatnonzero(cache.live)
        for state in cache.request.query_state():
            data = state.state.data
            axis = self._find_seq_axis(data.shape, len(cache.live))
            state.state = ov.Tensor(np.ascontiguousarray(np.take(data, keep, axis=axis)))
        cache.live = np.ones(len(keep), dtype=np.int64)

    def crop(self, cache: OVCache, length: int) -> None:
        """Forget positions >= length (mask them, or trim the state tensors)."""
        if cache.length <= length:
            return
        if length == 0:
            self._reset(cache)
            return
        first_dropped = np.flatnonzero(cache.live)[length]
        cache.live[first_dropped:] = 0
        cache.length = length
        stale = len(cache.live) - length
        if self.rollback == "trim" or stale >= self.max_stale:
            self._compact(cache)

    def forward(self, cache: OVCache, tokens: list[int], keep_last: int = 1) -> torch.Tensor:
        n = len(tokens)
        if cache.length == 0 and len(cache.live):
            self._reset(cache)
        past = cache.length
        live = np.concatenate([cache.live, np.ones(n, dtype=np.int64)])
        inputs = {
            "input_ids": np.asarray([tokens], dtype=np.int64),
            "attention_mask": live[None, :],
        }
        if "position_ids" in self._inputs:
            inputs["position_ids"] = np.arange(past, past + n, dtype=np.int64)[None, :]
        if "beam_idx" in self._inputs:
            inputs["beam_idx"] = np.zeros(1, dtype=np.int32)
        if past == 0:
            cache.request.reset_state()
        cache.request.infer(inputs)
        cache.live = live
        cache.length = past + n
        return self._rows(cache.request.get_tensor("logits").data[0, -keep_last:])

    def forward_batch(self, items: list[tuple[OVCache, list[int], int]]) -> list[torch.Tensor]:
        """One infer request per session: a batch runs as consecutive passes (the
        stateful layout cannot share a pass; the paged layout does)."""
        return [self.forward(*item) for item in items]
