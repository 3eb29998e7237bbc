"""Models by name.

* ``tiny-random``: a 2-layer llama built in-process from a fixed seed (no files); for
  tests.
* ``tiny-random-draft``: the same architecture and weights, perturbed from another fixed
  seed, so that its greedy choices agree with ``tiny-random`` only part of the time.
* ``smollm2-135m``: the real SmolLM2-135M-Instruct, from the folder `specdec prepare`
  converts once out of the bundled GGUF (located through specdec.paths).
* anything else: a Hugging Face model folder on disk (safetensors + tokenizer).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec import paths
from specdec.paths import PREPARED_NAMES

log = logging.getLogger(__name__)

TINY_TARGET = "tiny-random"
TINY_DRAFT = "tiny-random-draft"
TINY_NAMES = (TINY_TARGET, TINY_DRAFT)
TINY_VOCAB = 768
TINY_SEED = 1234
TINY_DRAFT_SEED = 4321
# Relative noise added to every draft weight; chosen so that greedy agreement with the
# target is partial (tests/runtime/test_models.py checks the band).
TINY_DRAFT_NOISE = 0.03


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel in eval mode
    model_id: str
    vocab_size: int
    tokenizer_digest: str
    max_context: int
    tokenizer: Any = None  # None for the tiny models (they speak token ids only)


def tiny_config():
    """The LlamaConfig of both tiny models."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.25,  # peaky distributions: acceptance tests see real rejections
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def tiny_recipe_hash() -> str:
    """A short hash of everything that defines the tiny models' weights and vocabulary:
    a folder or export made from them carries it, so a change never reuses a stale one."""
    recipe = repr((TINY_VOCAB, TINY_SEED, TINY_DRAFT_SEED, TINY_DRAFT_NOISE,
                   tiny_config().to_json_string()))
    return hashlib.sha256(recipe.encode()).hexdigest()[:8]


def build_tiny(name: str) -> LoadedModel:
    """Build `tiny-random` or `tiny-random-draft` deterministically."""
    from transformers import LlamaForCausalLM

    if name not in TINY_NAMES:
        raise ValueError(f"unknown tiny model {name!r}")
    config = tiny_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    if name == TINY_DRAFT:
        g = torch.Generator().manual_seed(TINY_DRAFT_SEED)
        with torch.no_grad():
            for param in model.parameters():
                noise = torch.randn(param.shape, generator=g) * param.std().clamp(min=1e-3)
                param.add_(noise * TINY_DRAFT_NOISE)
    model.eval()
    tokenizer = load_tokenizer(name)
    return LoadedModel(model, name, TINY_VOCAB, tokenizer_digest(tokenizer),
                       config.max_position_embeddings, tokenizer)


def tokenizer_digest(tokenizer) -> str:
    """A digest of what token ids mean: the vocabulary and the special tokens."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    payload = json.dumps({"vocab": vocab, "special": tokenizer.all_special_tokens})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def load_folder(path: str, device: str = "cpu", dtype: str = "float32") -> LoadedModel:
    """Load a Hugging Face causal LM and its tokenizer from a folder on disk (offline)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"model {path!r} is neither a built-in name ({', '.join(TINY_NAMES)}) "
            "nor a Hugging Face model folder on disk"
        )
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), local_files_only=True
    ).to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    config = model.config
    vocab = int(config.vocab_size)
    max_context = int(getattr(config, "max_position_embeddings", 2048))
    return LoadedModel(model, os.path.basename(os.path.normpath(path)), vocab,
                       tokenizer_digest(tokenizer), max_context, tokenizer)


def resolve(name: str) -> str:
    """The folder behind a model name: a prepared model's folder (FileNotFoundError until
    `specdec prepare` made it), else `name` itself, taken as a path."""
    if name not in PREPARED_NAMES:
        return name
    return str(paths.prepared_dir(name))


def load(name: str, device: str = "cpu", dtype: str = "float32") -> LoadedModel:
    """A built-in tiny model by name, a prepared model by name, or an HF folder by path."""
    if name in TINY_NAMES:
        loaded = build_tiny(name)
        loaded.model.to(device)
        return loaded
    return load_folder(resolve(name), device, dtype)


def load_tokenizer(name: str):
    """The tokenizer of a model by name or folder, without loading its weights."""
    from specdec.runtime import tiny_tokenizer

    if name in TINY_NAMES:
        return tiny_tokenizer.build(TINY_VOCAB)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_tokenizer_path(name), local_files_only=True)


def _tokenizer_path(name: str) -> str:
    """Where a model's tokenizer is read: a prepared model's (or its tokenizer's alone,
    specdec.paths.tokenizer_dir), else the folder `name`."""
    return str(paths.tokenizer_dir(name)) if name in PREPARED_NAMES else name


def stop_token_ids(name: str, tokenizer) -> list[int]:
    """The ids that end a generation: the tokenizer's eos, then any further ones the
    model's generation config lists (Qwen2.5 ends a chat turn with <|im_end|> and a raw
    completion with <|endoftext|>)."""
    ids = [] if tokenizer is None or tokenizer.eos_token_id is None \
        else [int(tokenizer.eos_token_id)]
    if name not in TINY_NAMES:
        try:
            config = json.loads((Path(_tokenizer_path(name)) / "generation_config.json")
                                .read_text())
        except (OSError, ValueError):
            config = {}
        more = config.get("eos_token_id")
        for i in more if isinstance(more, list) else [more] if more is not None else []:
            if int(i) not in ids:
                ids.append(int(i))
    return ids


def quantize_int8(loaded: LoadedModel) -> None:
    """Dynamic int8 quantization of every nn.Linear (CPU): a faster, less exact copy,
    so for a draft, never a target (its outputs drift from the fp32 model's)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        loaded.model = torch.ao.quantization.quantize_dynamic(
            loaded.model, {torch.nn.Linear}, dtype=torch.qint8)
