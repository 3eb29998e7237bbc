"""FR-Spec's frequency-ranked vocabulary: which rows a draft's sliced LM head keeps.

FR-Spec (Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling") drafts with an LM head restricted to the N most
frequent tokens: the head is a large share of a small draft's work (49,152 x 576 of
SmolLM2-135M's weights, about a fifth), and most of its rows are tokens a draft
practically never proposes. The target still verifies over the whole vocabulary, so the
output does not change; a token outside the head simply cannot be drafted.

The paper ranks tokens by their frequency in a general corpus. Here the corpus is the
target's own generated text: its answers to the fixed prompts of
specdec.runtime.fr_prompts, greedy and sampled (temperature 0.8), generated in-process on
the model's fp32 OpenVINO IR (paged backend, many prompts per forward pass). specdec's
drafts are the target's own model at lower precision or minus some layers, so the
model's fp32 text is the target's; a sliced export ranks the whole model it was cut
from. The ranking is, over the whole vocabulary:

1. the end-of-turn token, whatever its count: a draft that cannot propose the end of an
   answer loses a token at the end of every answer;
2. tokens by how often the target generated them. Prompt tokens are not counted: a draft
   never proposes prompt text, and a prompt (the chat template's markers, the user's
   wording) follows another distribution than the answers;
3. ties (most of them among tokens never generated) by how often the prompts used them:
   answers do copy the user's words, and prompts hold the words users write;
4. then by id: byte-level BPE ids follow the merge order, so a lower id was a more
   frequent pair in the tokenizer's training corpus, the kind of frequency FR-Spec ranks
   by itself.

The ranking is computed once and cached as JSON in the model's folder (`fr_vocab.json`),
with the recipe's digest and the source's stamp: a changed prompt list, recipe or model
is a cache miss. specdec.runtime.fr_head exports the sliced draft from it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdec.runtime.fr_prompts import PROMPTS

log = logging.getLogger(__name__)

FILE = "fr_vocab.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Recipe:
    """How the target's text is generated. Every field is in the cache's digest (the
    batch too: sessions share a pass's matmuls, so it can move a near-tie)."""

    max_new_tokens: int = 96
    temperatures: tuple[float, ...] = (0.0, 0.8)
    seed: int = 0
    batch: int = 32  # sessions per forward pass
    prompts: tuple[str, ...] = field(default_factory=lambda: tuple(PROMPTS))

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> dict:
        d = asdict(self)
        d["prompts"] = len(self.prompts)
        return {**d, "digest": self.digest()}


@dataclass
class Ranking:
    ids: list[int]  # every id of the vocabulary, most frequent first
    counts: dict[int, int]  # generated tokens per id (ids never generated are absent)
    generated_tokens: int
    meta: dict = field(default_factory=dict)

    def head(self, n: int) -> list[int]:
        """The N ids a head of size `n` keeps, sorted by id (the head's row order)."""
        if not 0 < n <= len(self.ids):
            raise ValueError(f"a head keeps 1 to {len(self.ids)} tokens, got {n}")
        return sorted(self.ids[:n])

    def coverage(self, n: int) -> float:
        """The share of the generated tokens a head of size `n` holds."""
        top = set(self.ids[:n])
        return sum(c for i, c in self.counts.items() if i in top) / max(1, self.generated_tokens)


def head_vocab_arg(text: str) -> int:
    """--head-vocab: an int >= 0 (0 = the full head). Standard library only: `specdec
    prepare` parses it before deciding whether to import anything heavy."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 = the full head), got {n}")
    return n


def rank(generated: Counter, prompt: Counter, vocab_size: int,
         first: Sequence[int] = ()) -> list[int]:
    """Every id in [0, vocab_size): `first` in order, then by generated count, then by
    prompt count (both descending), then by id. Deterministic."""
    head = [i for i in dict.fromkeys(first) if 0 <= i < vocab_size]
    pinned = set(head)
    rest = sorted((i for i in range(vocab_size) if i not in pinned),
                  key=lambda i: (-generated.get(i, 0), -prompt.get(i, 0), i))
    return head + rest


def _chat_ids(tokenizer, message: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def generate(backend, prompts: list[list[int]], recipe: Recipe, eos: set[int],
             progress: bool = True, desc: str = "FR-Spec ranking: target text"
             ) -> list[list[int]]:
    """The target's continuations of every prompt at every temperature of `recipe`
    (greedy at 0, else sampled with a seed per prompt and temperature), `recipe.batch`
    sessions per forward pass; each stops at an `eos` token or `max_new_tokens`."""
    from tqdm import tqdm

    from specdec.sampling import SamplingParams, generator, process_logits, sample

    budget = recipe.max_new_tokens
    bar = tqdm(total=len(prompts) * len(recipe.temperatures) * budget, unit="tok",
               desc=desc, disable=not progress)
    texts: list[list[int]] = []
    for t in recipe.temperatures:
        params = SamplingParams(temperature=t)
        for start in range(0, len(prompts), recipe.batch):
            chunk = prompts[start:start + recipe.batch]
            gens = [generator(recipe.seed, "fr-vocab", start + j, t) for j in range(len(chunk))]
            caches = [backend.new_cache() for _ in chunk]
            out: list[list[int]] = [[] for _ in chunk]
            active = list(range(len(chunk)))
            rows = backend.forward_batch([(caches[j], chunk[j], 1) for j in active])
            while active:
                still = []
                for j, row in zip(active, rows, strict=True):
                    logits = row[-1]
                    x = int(logits.argmax()) if params.greedy else \
                        sample(process_logits(logits, params), gens[j])
                    out[j].append(x)
                    if x in eos or len(out[j]) >= budget:
                        bar.update(budget - len(out[j]) + 1)
                    else:
                        bar.update()
                        still.append(j)
                active = still
                if active:
                    rows = backend.forward_batch([(caches[j], out[j][-1:], 1) for j in active])
            texts.extend(out)
            del caches  # their KV blocks go back to the pool
    bar.close()
    return texts


def _stamp(hf_dir: Path) -> float:
    return (Path(hf_dir) / "config.json").stat().st_mtime


def load(hf_dir: Path, recipe: Recipe | None = None) -> Ranking | None:
    """The cached ranking of `hf_dir`'s model for `recipe` (default: Recipe()), or None
    when absent, unreadable, of another recipe or format, or older than the model."""
    recipe = recipe or Recipe()
    try:
        data = json.loads((Path(hf_dir) / FILE).read_text())
        ok = data["format"] == FORMAT_VERSION and data["recipe"]["digest"] == recipe.digest() \
            and data["source_mtime"] == _stamp(hf_dir)
        ids = [int(i) for i in data["ranking"]]
        ok = ok and len(ids) == data["vocab_size"] and len(set(ids)) == len(ids) \
            and min(ids) == 0 and max(ids) == len(ids) - 1
        counts = {int(i): int(c) for i, c in data["generated_counts"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not ok:
        return None
    return Ranking(ids, counts, int(data["generated_tokens"]),
                   {k: v for k, v in data.items() if k not in ("ranking", "generated_counts")})


def ranked_vocab(hf_dir: Path, fp32_ir: Callable[[], Path], recipe: Recipe | None = None,
                 threads: int = 0, force: bool = False,
                 say: Callable[[str], None] = log.info, progress: bool = True) -> Ranking:
    """The frequency-ranked vocabulary of the model in `hf_dir` (a Hugging Face folder),
    from its cache `hf_dir/fr_vocab.json` unless absent or stale (or `force`): then the
    target's text is generated on its fp32 IR (`fp32_ir()` gives its folder, exporting
    it first if need be), counted, ranked and cached."""
    from transformers import AutoTokenizer

    from specdec.runtime.openvino_paged import PagedOpenVINOBackend

    hf_dir, recipe = Path(hf_dir), recipe or Recipe()
    cached = None if force else load(hf_dir, recipe)
    if cached is not None:
        say(f"FR-Spec ranking cached: {hf_dir / FILE}")
        return cached
    ir = fp32_ir()
    t0 = time.perf_counter()
    backend = PagedOpenVINOBackend(ir, "CPU", threads, "f32", "LATENCY",
                                   model_id=hf_dir.name, inference_precision="f32")
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    eos = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    prompts = [_chat_ids(tokenizer, m) for m in recipe.prompts]
    say(f"FR-Spec ranking of {hf_dir.name}: generating {len(prompts)} prompts x "
        f"temperatures {list(recipe.temperatures)} x up to {recipe.max_new_tokens} tokens "
        f"on its fp32 IR, {recipe.batch} sessions a pass")
    texts = generate(backend, prompts, recipe, eos, progress)
    generated = Counter(x for text in texts for x in text)
    prompt_counts = Counter(x for p in prompts for x in p)
    vocab = int(backend.vocab_size)
    ranking = rank(generated, prompt_counts, vocab, sorted(eos))
    total = sum(generated.values())
    seconds = time.perf_counter() - t0
    data = {"format": FORMAT_VERSION, "source": str(hf_dir), "source_mtime": _stamp(hf_dir),
            "recipe": recipe.describe(), "vocab_size": vocab, "sequences": len(texts),
            "generated_tokens": total, "distinct_generated": len(generated),
            "first": sorted(eos), "seconds": round(seconds, 1),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "generated_counts": {str(i): generated[i] for i in ranking if generated[i]},
            "ranking": ranking}
    tmp = hf_dir / f".{FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, hf_dir / FILE)  # written whole, then renamed: the cache's marker
    result = load(hf_dir, recipe)
    assert result is not None, "the ranking just written does not read back"
    say(f"FR-Spec ranking: {total} generated tokens ({len(generated)} distinct) in "
        f"{seconds:.0f} s; a head of 4096 holds {result.coverage(4096):.1%} of them; "
        f"wrote {hf_dir / FILE}")
    return result
