"""An FR-Spec draft: the model with its LM head cut to the N top-ranked tokens.

FR-Spec (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling") keeps only the rows of the draft's LM head that
belong to a frequency-ranked subset of the vocabulary (specdec.runtime.fr_vocab ranks
it). Here the cut is made once, in the exported IR:

* `sliced_model` loads the Hugging Face model in torch and replaces its LM head with an
  untied nn.Linear holding the N selected rows of the output embedding (SmolLM2 ties it
  to the input embedding, which stays whole: the draft still reads every token);
* `export_sliced` exports that model through optimum-intel, the same path and weight
  compression as every other IR (specdec.runtime.openvino_export), next to the plain IR
  as `<ir>-head<N>`, with `head_ids.json`: the N full-vocabulary ids, in the head's row
  order, which is ascending id. A head is a set (the ranks stay in fr_vocab.json), and
  ascending ids make the scatter back a single forward sweep through the output row;
* `HeadMap` is what the OpenVINO backends do with the N logits: scatter them into a
  full-vocabulary row filled with -inf. vocab_size stays the model's, so nothing above
  the backend changes: a token outside the head gets probability 0 after the softmax,
  is never the argmax, and is never proposed; the target verifies over the whole
  vocabulary, so the output is unchanged (lossless), only acceptance can drop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

HEAD_IDS = "head_ids.json"


def head_dir_for(ir_dir: Path, n: int) -> Path:
    """The IR folder of the model in `ir_dir` with a head of `n` rows: its sibling
    `<ir_dir>-head<n>` (smollm2-135m-ov-int8-head4096)."""
    ir_dir = Path(ir_dir)
    return ir_dir.with_name(f"{ir_dir.name}-head{n}")


def ids_digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:16]


def write_head_ids(ir_dir: Path, ids: Sequence[int], vocab_size: int) -> None:
    payload = {"vocab_size": int(vocab_size), "head_vocab": len(ids), "ids": [int(i) for i in ids]}
    (Path(ir_dir) / HEAD_IDS).write_text(json.dumps(payload) + "\n")


class HeadMap:
    """The full-vocabulary ids of a sliced head's rows, and the scatter back."""

    def __init__(self, ids: Sequence[int], vocab_size: int):
        index = np.asarray(ids, dtype=np.int64)
        if index.ndim != 1 or not len(index) or len(np.unique(index)) != len(index) \
                or index.min() < 0 or index.max() >= vocab_size:
            raise ValueError(f"head ids must be {len(index)} distinct ids in "
                             f"[0, {vocab_size})")
        self.ids, self.vocab_size = index, int(vocab_size)
        self.size = len(index)

    @classmethod
    def load(cls, ir_dir: Path, vocab_size: int) -> HeadMap | None:
        """The head map of the IR in `ir_dir`, or None when its head is whole."""
        path = Path(ir_dir) / HEAD_IDS
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        if int(data.get("vocab_size", vocab_size)) != vocab_size:
            raise ValueError(f"{path} is for a vocabulary of {data['vocab_size']}, the model "
                             f"has {vocab_size}")
        return cls(data["ids"], vocab_size)

    def expand(self, logits: np.ndarray) -> torch.Tensor:
        """[rows, N] head logits -> float32 [rows, V], -inf outside the head."""
        logits = np.asarray(logits, dtype=np.float32).reshape(-1, self.size)
        full = np.full((logits.shape[0], self.vocab_size), -np.inf, dtype=np.float32)
        full[:, self.ids] = logits
        return torch.from_numpy(full)


def sliced_model(hf_dir: Path, ids: Sequence[int]):
    """The Hugging Face model in `hf_dir` (torch, fp32) whose LM head keeps only the
    rows `ids`, in that order, untied from the input embedding."""
    from torch import nn
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                 local_files_only=True)
    old = model.get_output_embeddings()
    if not isinstance(old, nn.Linear) or old.bias is not None:
        raise ValueError(f"{hf_dir}: the LM head is not a bias-free nn.Linear; FR-Spec "
                         "slicing needs one")
    head = nn.Linear(old.in_features, len(ids), bias=False)
    with torch.no_grad():
        head.weight.copy_(old.weight[torch.as_tensor(list(ids), dtype=torch.long)])
    model.set_output_embeddings(head)
    model.config.tie_word_embeddings = False  # config.vocab_size stays the embedding's
    if hasattr(model.config, "get_text_config"):
        model.config.get_text_config().tie_word_embeddings = False
    return model.eval()


def export_sliced(hf_dir: Path, ids: Sequence[int], tmp: Path, quantization,
                  say: Callable[[str], None] = log.info) -> None:
    """Export the model of `hf_dir` with its head cut to `ids` as a stateful IR into the
    (new) folder `tmp`, weights compressed by `quantization` (an optimum-intel config, or
    None for fp32), and write `head_ids.json` beside it. The tokenizer and the marker
    are the caller's (openvino_export.export)."""
    from optimum.exporters.openvino import export_from_model
    from optimum.intel import OVModelForCausalLM

    raw = tmp.with_name(tmp.name + ".raw")
    shutil.rmtree(raw, ignore_errors=True)
    model = sliced_model(hf_dir, ids)
    vocab = int(model.config.vocab_size)
    say(f"exporting {Path(hf_dir).name} with an FR-Spec head of {len(ids)} of {vocab} "
        "tokens ...")
    try:
        export_from_model(model, raw, task="text-generation-with-past", stateful=True)
        del model
        ov_model = OVModelForCausalLM.from_pretrained(
            str(raw), export=False, compile=False, local_files_only=True,
            quantization_config=quantization, load_in_8bit=False)
        ov_model.save_pretrained(str(tmp))
    finally:
        shutil.rmtree(raw, ignore_errors=True)
    config = json.loads((tmp / "config.json").read_text())
    if int(config["vocab_size"]) != vocab:
        raise ValueError(f"the sliced export's config says vocab_size {config['vocab_size']}, "
                         f"not {vocab}")
    write_head_ids(tmp, ids, vocab)
