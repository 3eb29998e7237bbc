"""Export a Hugging Face folder to OpenVINO IR (optimum-intel), fp32 / int8 / int4 weights.

`specdec prepare --openvino` writes `<name>-ov-<weights>` next to the HF folder. Each IR
folder also gets the tokenizer and a marker written last (a half-written export is not a
cache hit). int4 uses group size 64: SmolLM2's hidden size 576 is not a multiple of the
default 128.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from specdec import paths
from specdec.paths import ir_dir_for
from specdec.runtime import lean_tokenizer

log = logging.getLogger(__name__)

WEIGHTS = ("fp32", "int8", "int4")
MARKER = ".specdec-ov-export.json"
FORMAT_VERSION = 2  # 2: also writes openvino_tokenizer/detokenizer.xml (OpenVINO GenAI)


def is_exported(ir_dir: Path, hf_dir: Path, extra: dict | None = None) -> bool:
    """True when `ir_dir` holds a complete export of `hf_dir` as it is now; `extra`: what
    else its marker must say (a sliced head's size and ids)."""
    try:
        marker = json.loads((ir_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    source_mtime = (hf_dir / "config.json").stat().st_mtime
    return marker.get("format") == FORMAT_VERSION and marker.get("source_mtime") == source_mtime \
        and all(marker.get(k) == v for k, v in (extra or {}).items()) \
        and (ir_dir / "openvino_model.xml").exists() and (ir_dir / "openvino_model.bin").exists()


def _quantization(weights: str):
    from optimum.intel import OVWeightQuantizationConfig

    if weights == "fp32":
        return None
    if weights == "int8":
        return OVWeightQuantizationConfig(bits=8)
    return OVWeightQuantizationConfig(bits=4, group_size=64, sym=False, ratio=1.0)


def _save_ov_tokenizer(tokenizer, out: Path, say: Callable[[str], None]) -> None:
    """Tokenizer/detokenizer IRs, so OpenVINO GenAI can run the same folder (benchmarks)."""
    try:
        import openvino as ov
        from openvino_tokenizers import convert_tokenizer
    except ImportError:
        return
    try:
        tok, detok = convert_tokenizer(tokenizer, with_detokenizer=True)
    except Exception as exc:  # noqa: BLE001 - optional extra; the IR itself is fine
        say(f"note: no OpenVINO tokenizer IR ({exc}); OpenVINO GenAI cannot use {out.name}")
        return
    ov.save_model(tok, str(out / "openvino_tokenizer.xml"))
    ov.save_model(detok, str(out / "openvino_detokenizer.xml"))


def export(hf_dir: Path, weights: str = "fp32", force: bool = False,
           say: Callable[[str], None] = log.info, skip_layers: tuple[int, ...] = (),
           head_vocab: int = 0) -> Path:
    """The IR folder for `hf_dir` at `weights`, exporting it first unless cached; with
    `skip_layers`, of the model minus those layers (a layer-skip draft), exported from a
    pruned copy of the folder (specdec.runtime.layer_skip); with `head_vocab` N > 0, of
    the model whose LM head keeps only the N tokens the (whole) model generates most
    (an FR-Spec draft, specdec.runtime.fr_head; the ranking is computed once, by
    specdec.runtime.fr_vocab), in `<ir>-head<N>`."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    hf_dir = source = Path(hf_dir)
    if skip_layers:
        from specdec.runtime.layer_skip import prune_folder

        hf_dir = prune_folder(hf_dir, tuple(skip_layers), say)
    out, extra, head_ids = ir_dir_for(hf_dir, weights), {}, None
    if head_vocab:
        from specdec.runtime import fr_head
        from specdec.runtime.fr_vocab import ranked_vocab

        # the whole model's text: the target's (generated on its fp32 IR)
        ranking = ranked_vocab(source, lambda: export(source, "fp32", say=say), say=say)
        if not 0 < head_vocab < len(ranking.ids):
            raise ValueError(f"--head-vocab must be between 1 and {len(ranking.ids) - 1} (the "
                             f"vocabulary has {len(ranking.ids)} tokens), got {head_vocab}")
        head_ids = ranking.head(head_vocab)
        out = fr_head.head_dir_for(out, head_vocab)
        extra = {"head_vocab": head_vocab, "head_ids": fr_head.ids_digest(head_ids)}
    if not force and is_exported(out, hf_dir, extra):
        say(f"already exported: {out}")
        return out
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoTokenizer

    from specdec.runtime.openvino_backend import cap_cpu_isa_below_amx

    cap_cpu_isa_below_amx()  # before anything in this process compiles (NNCF may)
    t0 = time.perf_counter()
    say(f"exporting {hf_dir.name} to OpenVINO IR ({weights} weights) ...")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if head_ids is not None:
        from specdec.runtime.fr_head import export_sliced

        export_sliced(hf_dir, head_ids, tmp, _quantization(weights), say)
    else:
        model = OVModelForCausalLM.from_pretrained(
            str(hf_dir), export=True, compile=False, local_files_only=True,
            quantization_config=_quantization(weights), load_in_8bit=False,
        )
        model.save_pretrained(str(tmp))
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    tokenizer.save_pretrained(str(tmp))
    _save_ov_tokenizer(tokenizer, tmp, say)
    lean_tokenizer.keep(tmp)  # what the services read instead of loading the tokenizer
    marker = {"format": FORMAT_VERSION, "weights": weights, "source": str(hf_dir),
              "source_mtime": (hf_dir / "config.json").stat().st_mtime, **extra}
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    size = sum(p.stat().st_size for p in out.iterdir()) / 1e6
    say(f"exported {out} ({size:.0f} MB) in {time.perf_counter() - t0:.0f} s")
    return out


def export_tiny(name: str, weights: str, home: Path, skip_layers: tuple[int, ...] = (),
                head_vocab: int = 0) -> Path:
    """A tiny built-in model as an HF folder under `home`, then its IR (cached).

    The folder name carries a hash of the tiny models' definition, so a change to it
    never reuses a stale export."""
    from specdec.runtime import models

    hf_dir = paths.model_dir(f"{name}-{models.tiny_recipe_hash()}", home)
    if not (hf_dir / "config.json").exists():
        loaded = models.build_tiny(name)
        tmp = hf_dir.with_name(hf_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        loaded.model.save_pretrained(str(tmp))
        loaded.tokenizer.save_pretrained(str(tmp))
        shutil.rmtree(hf_dir, ignore_errors=True)
        tmp.rename(hf_dir)
    return export(hf_dir, weights, skip_layers=skip_layers, head_vocab=head_vocab)


def resolve_ir(model: str, weights: str, skip_layers: tuple[int, ...] = (),
               head_vocab: int = 0) -> tuple[Path, str]:
    """(IR folder, model_id) for a --model value, --weights, --skip-layers and
    --head-vocab (0 = the full LM head)."""
    from specdec.runtime.fr_head import head_dir_for
    from specdec.runtime.layer_skip import format_set, pruned_dir_for
    from specdec.runtime.models import TINY_NAMES

    def ir_of(hf_dir: Path) -> Path:
        ir = ir_dir_for(pruned_dir_for(hf_dir, skip_layers) if skip_layers else hf_dir, weights)
        return head_dir_for(ir, head_vocab) if head_vocab else ir

    if model in TINY_NAMES:
        return export_tiny(model, weights, paths.default_home(), skip_layers, head_vocab), model
    if model in paths.PREPARED_NAMES:
        ir = ir_of(paths.model_dir(model))
        if not (ir / "openvino_model.xml").exists():
            skip = f" --skip-layers {format_set(skip_layers)}" if skip_layers else ""
            head = f" --head-vocab {head_vocab}" if head_vocab else ""
            raise FileNotFoundError(f"no {weights} OpenVINO IR for {model}{skip}{head} at {ir}; "
                                    f"run `specdec prepare --openvino --weights {weights}{skip}"
                                    f"{head}` first")
        return ir, model
    path = Path(model)
    if (path / "openvino_model.xml").exists():
        for flag, value in (("--skip-layers", skip_layers), ("--head-vocab", head_vocab)):
            if value:
                raise ValueError(f"{model} is an OpenVINO IR; {flag} needs the Hugging "
                                 "Face folder it came from (or a prepared model name)")
        return path, path.name
    ir = ir_of(path)
    if (ir / "openvino_model.xml").exists():
        return ir, path.name
    if (path / "config.json").exists() and not skip_layers and not head_vocab:
        # any Hugging Face folder: exported beside it on first use, then cached
        return export(path, weights), path.name
    raise FileNotFoundError(f"{model!r} holds no OpenVINO IR (openvino_model.xml) and no "
                            f"{ir.name} export exists next to it")
