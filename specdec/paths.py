"""Where models live on disk: the cache root, model folders, their markers, IR folders.

Shared by `specdec prepare` (which writes these folders) and the runtime (which reads
them), so the runtime never imports a CLI module. Standard library only: finding a
prepared folder must not import torch or transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SPECDEC_HOME = "SPECDEC_HOME"  # environment variable naming the cache root
DEFAULT_HOME = Path("~/.cache/specdec")
SMOLLM2 = "smollm2-135m"
QWEN_CODER_TARGET = "qwen2.5-coder-1.5b"  # `specdec prepare --pair qwen2.5-coder`
QWEN_CODER_DRAFT = "qwen2.5-coder-0.5b"
QWEN_CODER_TOKENIZER = "qwen2.5-coder-tokenizer"  # the pair's tokenizer alone (--only)
# Real models by name: each lives in a folder that `specdec prepare` writes.
PREPARED_NAMES = (SMOLLM2, QWEN_CODER_TARGET, QWEN_CODER_DRAFT, QWEN_CODER_TOKENIZER)
# A model whose tokenizer is also prepared alone (a coordinator needs no weights).
TOKENIZER_OF = {QWEN_CODER_TARGET: QWEN_CODER_TOKENIZER, QWEN_CODER_DRAFT: QWEN_CODER_TOKENIZER}
MARKER = ".specdec-prepared.json"  # written last into a prepared folder
FORMAT_VERSION = 1  # bump when the folder layout or the tokenizer repair changes


def default_home() -> Path:
    """$SPECDEC_HOME, else ~/.cache/specdec; read at call time so tests can redirect it."""
    return Path(os.environ.get(SPECDEC_HOME) or DEFAULT_HOME).expanduser()


def model_dir(name: str = SMOLLM2, home: Path | None = None) -> Path:
    """The folder of model `name` under the cache root `home` (default: default_home())."""
    return Path(home or default_home()).expanduser() / "models" / name


def ir_dir_for(hf_dir: Path, weights: str) -> Path:
    """The OpenVINO IR folder exported from `hf_dir` at `weights`: a sibling of it."""
    hf_dir = Path(hf_dir)
    return hf_dir.parent / f"{hf_dir.name}-ov-{weights}"


def read_marker(folder: Path) -> dict | None:
    """The marker, or None when it is absent, unreadable, of another format, or when a file
    it lists is missing or has another size (a half-deleted folder is not a cache hit)."""
    try:
        marker = json.loads((Path(folder) / MARKER).read_text())
        if marker.get("format") != FORMAT_VERSION:
            return None
        for name, size in marker["files"].items():
            if (Path(folder) / name).stat().st_size != size:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return marker


def is_complete(folder: Path) -> bool:
    """True when `folder` holds a complete prepared model (of whatever source)."""
    return read_marker(folder) is not None


def source_stamp(source: Path) -> dict:
    """What a cache hit compares: the source file's size and modification time. Cheap
    (one stat), unlike hashing the file; a replaced or rewritten file gets a new stamp."""
    st = Path(source).stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_prepared(folder: Path, source: Path) -> bool:
    """True when `folder` holds a complete conversion of `source` as it is now: the
    marker is valid and records the source's current stamp (see `source_stamp`)."""
    marker = read_marker(folder)
    if marker is None:
        return False
    recorded = marker.get("source")
    if not isinstance(recorded, dict):
        return False
    return all(recorded.get(k) == v for k, v in source_stamp(source).items())


def prepared_dir(name: str) -> Path:
    """The folder of the prepared model `name`; FileNotFoundError until `specdec prepare`
    has made it."""
    folder = model_dir(name)
    if not is_complete(folder):
        raise FileNotFoundError(
            f"model {name!r} is not prepared (no complete folder at {folder}); "
            "run `specdec prepare` first"
        )
    return folder


def tokenizer_dir(name: str) -> Path:
    """The folder to read model `name`'s tokenizer (and generation config) from: its own,
    or, when only that is prepared, its tokenizer's alone (TOKENIZER_OF)."""
    alone = TOKENIZER_OF.get(name)
    if alone and not is_complete(model_dir(name)) and is_complete(model_dir(alone)):
        return model_dir(alone)
    return prepared_dir(name)
