"""Self-speculative drafts: the target's own decoder with some layers skipped.

Draft & Verify (Zhang et al. 2023, "Draft & Verify: Lossless Large Language Model
Acceleration via Self-Speculative Decoding") drafts with the target's weights minus a
chosen set of its decoder layers. Every layer is a residual update of the hidden state,
so skipping one still leaves a model that predicts the same tokens often enough to
draft; the target verifies, so the output does not change.

In specdec the draft is a service of its own. A layer-skip draft is the target's model
served with `--skip-layers`, on a cheaper device, with no second model to ship.

A skip set is written "3,5,7" or with ranges, "3-5,9", 0-based. "@path" reads the same
from a file, which is what `specdec tune-skip` writes. The set is validated against the
model's layer count, and it is part of the draft's ModelInfo.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path

SkipSet = tuple[int, ...]


def _read(text: str) -> str:
    """`text`, or the first line of the file "@path" names."""
    text = text.strip()
    if not text.startswith("@"):
        return text
    path = Path(text[1:])
    try:
        content = path.read_text().strip()
    except OSError as e:
        raise ValueError(f"{text}: cannot read {path}: {e.strerror}") from e
    return content.splitlines()[0].strip() if content else ""


def parse(text: str) -> SkipSet:
    """A skip set from "3,5,7", "3-5,9" or "@file" (whose text is the same); sorted and
    unique. "" is the empty set. ValueError names what is wrong."""
    text = _read(text)
    layers: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"skip set {text!r}: {part!r} is not a layer index or a range "
                             "like 3-5") from None
        if first < 0 or last < first:
            raise ValueError(f"skip set {text!r}: {part!r} is not a range of layer indices "
                             ">= 0")
        layers.update(range(first, last + 1))
    return tuple(sorted(layers))


def parse_order(text: str) -> SkipSet:
    """A ranked list of layers ("12,25,3", ranges allowed, or "@file"), in the order
    written, each once: the order in which an on-the-fly draft skips them."""
    order: list[int] = []
    for part in (p.strip() for p in _read(text).split(",")):
        for i in parse(part) if part else ():
            if i not in order:
                order.append(i)
    return tuple(order)


def order_arg(text: str) -> SkipSet:
    """`parse_order` as an argparse type."""
    try:
        return parse_order(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def arg(text: str) -> SkipSet:
    """`parse` as an argparse type (its message becomes the usage error)."""
    try:
        return parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def format_set(skip: SkipSet) -> str:
    """The canonical text of a skip set ("3,5,7"), as `parse` reads it."""
    return ",".join(str(i) for i in skip)


def validate(skip: SkipSet, num_layers: int) -> None:
    """ValueError unless every index is a layer of a `num_layers`-layer model and at least
    one layer is kept."""
    outside = [i for i in skip if i >= num_layers]
    if outside:
        raise ValueError(f"skip set {format_set(skip)}: the model has {num_layers} decoder "
                         f"layers (0-{num_layers - 1}); {format_set(tuple(outside))} is not "
                         "one of them")
    if len(skip) >= num_layers:
        raise ValueError(f"skip set {format_set(skip)} skips all {num_layers} decoder "
                         "layers; keep at least one")


def random_sets(num_layers: int, size: int, count: int, seed: int,
                exclude: SkipSet = ()) -> list[SkipSet]:
    """Up to `count` distinct random sets of `size` layers, never `exclude` (seeded): what
    a tuned set is compared with."""
    import random

    rng = random.Random(seed)
    out: list[SkipSet] = []
    for _ in range(100 * count):
        if len(out) == count:
            break
        skip = tuple(sorted(rng.sample(range(num_layers), size)))
        if skip not in out and skip != tuple(exclude):
            out.append(skip)
    return out


def decoder_layers(model):
    """The decoder layers of a Hugging Face causal LM (Llama-style: model.model.layers)."""
    from torch import nn

    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no model.layers: layer skipping needs "
                         "a Llama-style decoder")
    return layers


def _set_layers(model, layers: list, layer_types: list | None) -> None:
    """Make `layers` the model's decoder, numbered 0..n-1 (their attention's layer_idx
    picks its slot in the KV cache, which has one slot per layer of
    config.num_hidden_layers), so caches and exports see an ordinary n-layer model."""
    from torch import nn

    for new_index, layer in enumerate(layers):
        attention = getattr(layer, "self_attn", None)
        if attention is not None and hasattr(attention, "layer_idx"):
            attention.layer_idx = new_index
        if hasattr(layer, "layer_idx"):
            layer.layer_idx = new_index
    model.model.layers = nn.ModuleList(layers)
    if layer_types:
        model.config.layer_types = layer_types
    model.config.num_hidden_layers = len(layers)


def _kept(model, skip: SkipSet) -> tuple[list, list | None]:
    layers = decoder_layers(model)
    validate(skip, len(layers))
    types = getattr(model.config, "layer_types", None)
    keep = [i for i in range(len(layers)) if i not in set(skip)]
    return [layers[i] for i in keep], [types[i] for i in keep] if types else None


def drop_layers(model, skip: SkipSet) -> None:
    """Remove the `skip` layers from `model` in place, the kept ones renumbered."""
    _set_layers(model, *_kept(model, skip))


@contextmanager
def skipped(model, skip: SkipSet):
    """`model` without the `skip` layers inside the block, whole again after it: one
    loaded model evaluates many skip sets (specdec tune-skip). Caches made inside the
    block belong to the smaller model."""
    layers = list(decoder_layers(model))
    types = getattr(model.config, "layer_types", None)
    types = list(types) if types else None
    _set_layers(model, *_kept(model, skip))
    try:
        yield model
    finally:
        _set_layers(model, layers, types)


MARKER = ".specdec-skip.json"


def pruned_dir_for(hf_dir: Path, skip: SkipSet) -> Path:
    """Where the model folder minus the `skip` layers lives: next to the original, named
    after the set (its OpenVINO exports then sit next to it, `<that>-ov-<weights>`)."""
    hf_dir = Path(hf_dir)
    return hf_dir.with_name(f"{hf_dir.name}-skip{'_'.join(str(i) for i in skip)}")


def _is_pruned(out: Path, hf_dir: Path, skip: SkipSet) -> bool:
    import json

    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("skip") == list(skip) and \
        marker.get("source_mtime") == (hf_dir / "config.json").stat().st_mtime


def prune_folder(hf_dir: Path, skip: SkipSet, say=print) -> Path:
    """A Hugging Face folder of the model minus the `skip` layers (an ordinary n-layer
    model, layers renumbered, config to match), written once per set and source: what
    the OpenVINO export of a layer-skip draft starts from."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir = Path(hf_dir)
    out = pruned_dir_for(hf_dir, skip)
    if _is_pruned(out, hf_dir, skip):
        return out
    say(f"writing {hf_dir.name} without layers {format_set(skip)} to {out}")
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True)
    drop_layers(model, skip)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True).save_pretrained(str(tmp))
    marker = {"skip": list(skip), "source": str(hf_dir),
              "source_mtime": (hf_dir / "config.json").stat().st_mtime}
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
