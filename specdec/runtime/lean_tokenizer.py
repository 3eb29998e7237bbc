"""A model service's tokenizer, loaded only if something asks for it.

A model service needs two things from its tokenizer: the digest it reports (what token
ids mean, checked against the other services and the coordinator) and, for structured
outputs, llguidance's view of the vocabulary. Loading a Hugging Face tokenizer with
Qwen2.5's 151,936 tokens costs a process ~300 MiB that it never gives back (Python
objects of the vocabulary and the merges; measured on Qwen2.5-Coder-0.5B: +303 MiB of
anonymous memory, +260 MiB after malloc_trim), a quarter of the draft service's RSS.

So the digest, the end token and the tokenizer as llguidance reads it (the Rust
tokenizer serialised, as `llguidance.hf.from_tokenizer` makes it) are computed once per
model folder, in a child process, and kept beside the IR (`SIDECAR`, keyed by the
tokenizer files' sizes and times). The service builds llguidance's tokenizer from that
text, and loads the Hugging Face tokenizer only when code asks for it (`LazyTokenizer`).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SIDECAR = ".specdec-tokenizer.json"
FORMAT = 1
SOURCES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
           "vocab.json", "merges.txt", "added_tokens.json")


def _source_key(folder: Path) -> list:
    return [[n, st.st_size, st.st_mtime_ns] for n in SOURCES
            if (p := folder / n).exists() and (st := p.stat())]


def _load_hf(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def describe(folder: Path) -> dict:
    """What a service needs from `folder`'s tokenizer (loads it: run in a child)."""
    from copy import copy

    from specdec.runtime.models import tokenizer_digest

    tokenizer = _load_hf(folder)
    lean = None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # a fast tokenizer: what llguidance.hf.from_tokenizer reads
        backend = copy(backend)
        backend.no_padding()
        backend.no_truncation()
        lean = backend.to_str()
    return {"format": FORMAT, "source": _source_key(folder),
            "digest": tokenizer_digest(tokenizer), "eos_token_id": tokenizer.eos_token_id,
            "llguidance": lean}


@dataclass(frozen=True)
class TokenizerFacts:
    digest: str
    eos_token_id: int | None
    llguidance: str | None  # the serialised Rust tokenizer (None: a slow tokenizer)


def facts(folder: Path) -> TokenizerFacts:
    """The digest, end token and llguidance text of `folder`'s tokenizer: read from the
    sidecar, else computed in a child process (this process never loads the tokenizer)
    and written beside the model when the folder is writable."""
    folder = Path(folder)
    path = folder / SIDECAR
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or data.get("source") != _source_key(folder):
            data = None
    except (OSError, ValueError):
        data = None
    if data is None:
        out = subprocess.run([sys.executable, "-m", __name__, str(folder)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"could not read the tokenizer in {folder}: "
                               f"{out.stderr.strip().splitlines()[-1:] or out.returncode}")
        data = json.loads(out.stdout)
        try:
            _write(path, data)
        except OSError as exc:  # a read-only model folder: computed again next start
            log.info("could not keep the tokenizer's facts beside %s: %s", folder, exc)
    return TokenizerFacts(data["digest"], data["eos_token_id"], data["llguidance"])


def keep(folder: Path) -> None:
    """Write the sidecar in this process: for a folder being exported, where loading the
    tokenizer costs nothing that stays, so its services start without the child."""
    _write(Path(folder) / SIDECAR, describe(Path(folder)))


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class LazyTokenizer:
    """Stands for the Hugging Face tokenizer of `folder`: loads it on first use, and gives
    llguidance its tokenizer without loading it (`llguidance_tokenizer`)."""

    def __init__(self, folder: Path, known: TokenizerFacts):
        self._folder, self._facts = Path(folder), known
        self._loaded = None
        self._lock = threading.Lock()

    def llguidance_tokenizer(self, n_vocab: int):
        """llguidance's LLTokenizer, as `llguidance.hf.from_tokenizer` would build it."""
        if self._facts.llguidance is None:
            raise ValueError("only fast (Rust) tokenizers convert for llguidance")
        from llguidance import LLTokenizer

        return LLTokenizer(self._facts.llguidance, n_vocab=n_vocab,
                           eos_token=self._facts.eos_token_id)

    @property
    def hf(self):
        with self._lock:
            if self._loaded is None:
                log.info("loading the Hugging Face tokenizer of %s", self._folder)
                self._loaded = _load_hf(self._folder)
            return self._loaded

    def __getattr__(self, name: str):
        if name.startswith("_"):  # copy/pickle probes, and attributes not set yet
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __call__(self, *args, **kwargs):
        return self.hf(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.hf)


if __name__ == "__main__":
    print(json.dumps(describe(Path(sys.argv[1]))))
