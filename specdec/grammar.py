"""Structured outputs: a grammar the generated text must match (docs/design.md, section 26).

A `Grammar` is what a request asks for: a JSON schema, any JSON object, a regex, a choice
among strings, or a Lark grammar. Both services hold a matcher per session
(`GrammarState`) and mask with it:

* the target masks p at every verified position: its matcher has consumed the committed
  text, then walks the round's drafts, so row r allows exactly what target-only
  constrained decoding would allow after the first r drafts. Verification of masked p
  against the draft's q keeps the constrained distribution exactly (the accept/resample
  rule holds for any p; a draft the grammar refuses has p = 0 and is rejected);
* the draft masks q with its own matcher, so its drafts are valid and mostly accepted.

The matcher's state is a function of the session's token ids: `GrammarState.sync` rolls
back and consumes until the matcher holds exactly the tokens after the prompt. The
cache-sync rule (keep_len + digest, a mismatch re-syncs) that keeps the ids right
therefore keeps the matchers right, with no state of their own on the wire. The grammar's
text travels only when a session (re)starts (keep_len = 0); later requests name it by
`digest`, and a service that does not hold it asks for a resync.

The engine is llguidance (Microsoft's Low-Level Guidance: an Earley parser over a lexer
that walks the token trie). Chosen over xgrammar because it has no dependencies of its own
(xgrammar needs torch and pulls its own toolchain), rolls back any number of tokens,
validates a grammar without a tokenizer (the HTTP layer's 400s), and takes JSON schema,
regex and Lark in one compiler. Its token masks cost about 0.2 ms for SmolLM2's 49,152
tokens.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec.errors import FailedPrecondition, InvalidArgument, require

log = logging.getLogger(__name__)
KINDS = ("json_schema", "json_object", "regex", "choice", "lark")
# Compact JSON, as json.dumps writes it: a model cannot pad it with whitespace forever.
# A schema's own "x-guidance" options override these.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_SPEC_BYTES = 64 * 1024
# llguidance's lexeme attributes that disable rollback (Lark: `name[stop="\n"]: ...`)
NO_ROLLBACK = re.compile(r"\[[^\]\n]*\b(stop|max_tokens)\s*=")


@dataclass(frozen=True)
class Grammar:
    kind: str  # one of KINDS
    spec: str = ""  # the schema (JSON text), regex, choices (a JSON list) or Lark text
    digest: int = 0  # names (kind, spec) when the spec is left off the wire

    @staticmethod
    def of(kind: str, spec: str = "") -> Grammar:
        raw = hashlib.blake2b(f"{kind}\0{spec}".encode(), digest_size=8).digest()
        return Grammar(kind, spec, int.from_bytes(raw, "little"))

    def llguidance(self) -> str:
        """The grammar in llguidance's form. ValueError when the spec cannot be read
        (bad JSON); whether it compiles is `check`'s question."""
        from llguidance import LLMatcher

        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS)
        if self.kind == "json_schema":
            schema = json.loads(self.spec)
            if not isinstance(schema, dict):
                raise ValueError("the schema must be a JSON object")
            return LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        if self.kind == "choice":
            choices = json.loads(self.spec)
            if not (isinstance(choices, list) and choices
                    and all(isinstance(c, str) and c for c in choices)):
                raise ValueError("the choices must be a non-empty list of non-empty strings")
            return LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(c) for c in choices))
        if self.kind == "lark":
            from llguidance.gbnf_to_lark import any_to_lark

            return LLMatcher.grammar_from_lark(any_to_lark(self.spec))
        raise ValueError(f"unknown grammar kind {self.kind!r}; one of {', '.join(KINDS)}")


def check(grammar: Grammar, tokenizer=None) -> str:
    """Why the grammar cannot be used ("" when it can); `tokenizer` (an LLTokenizer)
    also checks it against a vocabulary. Never raises."""
    from llguidance import LLMatcher

    if grammar.kind not in KINDS:
        return f"unknown grammar kind {grammar.kind!r}; one of {', '.join(KINDS)}"
    if grammar.kind != "json_object" and not grammar.spec:
        return f"a {grammar.kind} grammar needs its text"
    if len(grammar.spec.encode()) > MAX_SPEC_BYTES:
        return f"the grammar is over {MAX_SPEC_BYTES // 1024} KiB"
    if grammar.kind == "lark" and NO_ROLLBACK.search(grammar.spec):
        return ("a lexeme with stop= or max_tokens= cannot be rolled back, which "
                "verifying drafts needs; use suffix= (llguidance's) or a plain rule")
    try:
        compiled = grammar.llguidance()
        error, messages = LLMatcher.validate_grammar_with_warnings(compiled, tokenizer)
    except Exception as e:  # noqa: BLE001 - bad JSON, a GBNF the converter cannot read
        return str(e) or type(e).__name__
    return messages[0] if error else ""


@functools.cache
def vocabulary(tokenizer, n_vocab: int):
    """llguidance's view of a Hugging Face tokenizer with `n_vocab` logit columns (about
    a second for a 49k vocabulary, so once per process)."""
    import llguidance.hf

    lean = getattr(tokenizer, "llguidance_tokenizer", None)  # lean_tokenizer.LazyTokenizer
    if lean is not None:
        return lean(n_vocab)
    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab)


class GrammarState:
    """One session's matcher: it has consumed `consumed`, the ids after the prompt."""

    def __init__(self, grammar: Grammar, fresh, prompt_len: int, eos: Sequence[int],
                 width: int = 0):
        self.grammar = grammar
        self.width = width  # the logits' columns (the model's vocabulary)
        self._fresh = fresh  # the compiled matcher before any token (shared; never fed)
        self.matcher = fresh.deep_copy()
        self.prompt_len = prompt_len
        self.eos = list(eos)
        self.consumed: list[int] = []

    def _restart(self) -> None:
        """A new matcher from the start. For a grammar llguidance cannot roll back (a
        lexeme with stop= or max_tokens=), or one it left in its error state, which it
        never leaves: the next sync re-feeds the ids."""
        self.matcher = self._fresh.deep_copy()
        self.consumed = []

    def _check(self) -> None:
        if self.matcher.is_error():
            error = self.matcher.get_error()
            self._restart()
            raise InvalidArgument(f"the request's {self.grammar.kind} grammar failed: {error}")

    def sync(self, tokens: Sequence[int], strict: bool = True) -> bool:
        """Roll back and consume until the matcher holds exactly tokens[prompt_len:].
        A token the grammar refuses is InvalidArgument when `strict` (the target's
        committed text); otherwise the matcher stops before it and sync returns False
        (the draft's session may hold a pre-draft's assumed drafts: a context that will
        never be committed, so what is drafted from it is never used)."""
        target = list(tokens[self.prompt_len:])
        same = 0
        limit = min(len(self.consumed), len(target))
        while same < limit and self.consumed[same] == target[same]:
            same += 1
        if same < len(self.consumed):
            if self.matcher.rollback(len(self.consumed) - same) and not self.matcher.is_error():
                del self.consumed[same:]
            else:
                self._restart()
                same = 0
        rest = target[same:]
        if rest:
            ok = self.matcher.validate_tokens(rest)
            if ok < len(rest) and strict:
                at = self.prompt_len + same + ok
                raise InvalidArgument(
                    f"token {rest[ok]} at position {at} breaks the request's "
                    f"{self.grammar.kind} grammar (the committed text must match it; "
                    "sampling.prompt_len must say where the prompt ends)")
            if ok:
                self.matcher.consume_tokens(rest[:ok])
                self.consumed += rest[:ok]
                self._check()
            return ok == len(rest)
        return True

    def masks(self, drafts: Sequence[int], width: int) -> torch.Tensor:
        """Allowed tokens [len(drafts) + 1, width] (bool): row r after the first r drafts.
        The matcher consumes the drafts it allows; rows after a refused draft allow
        everything (the round is decided at the refused draft; nothing later is used)."""
        # (a refused token would put the matcher in its error state for good)
        valid = self.matcher.validate_tokens(list(drafts)) + 1
        bits = torch.full((len(drafts) + 1, (width + 31) // 32), -1, dtype=torch.int32)
        for r in range(valid):
            fill_mask(self.matcher, bits[r])
            self._check()  # e.g. a parser limit: an error, not an end-of-sequence-only row
            if r < valid - 1:
                self.consume(drafts[r])
        allowed = unpack(bits, width)
        allowed[valid:] = True
        for r in (~allowed[:valid].any(dim=1)).nonzero().flatten().tolist():
            allowed[r, self.eos] = True  # stopped after an end of sequence: only the end
        return allowed

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` (after the consumed text) the grammar allows."""
        return self.matcher.validate_tokens(list(tokens))

    def forced(self, limit: int) -> list[int]:
        """Jump-forward decoding (SGLang's; Zheng et al., "SGLang: Efficient Execution of
        Structured Language Model Programs"): while the grammar allows exactly one token
        after the consumed text, take it (at most `limit`, stopping after an end of
        sequence). Each is what target-only constrained decoding would emit there, its
        masked p being one-hot, so it is committed without a model pass."""
        out: list[int] = []
        while len(out) < limit:
            allowed = self.masks([], self.width)[0].nonzero().flatten()
            if len(allowed) != 1:  # (an error state raises in masks: never an end here)
                break
            token = int(allowed[0])
            out.append(token)
            if token in self.eos or not self.consume(token):
                break
        return out

    def consume(self, token: int) -> bool:
        """Take one token the caller chose (the draft's); False if the grammar refuses it."""
        if self.matcher.try_consume_tokens([token]) == 1:
            self.consumed.append(token)
            return True
        return False


def fill_mask(matcher, row: torch.Tensor) -> None:
    """Write the matcher's next-token bitmask into `row` (int32, contiguous, CPU), as
    llguidance.torch's fill_next_token_bitmask does. That module is not imported: it
    decorates a function with torch.compile at import, which loads TorchDynamo, sympy
    and networkx (~110 MiB of every service's RSS, measured on the pair's draft)."""
    if row.dtype != torch.int32 or not row.is_contiguous() or row.device.type != "cpu":
        raise ValueError("a grammar mask row must be contiguous int32 on the CPU")
    matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())


def unpack(bits: torch.Tensor, width: int) -> torch.Tensor:
    """llguidance's bitmask [rows, ceil(width / 32)] int32 as bool [rows, width]."""
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = (bits.unsqueeze(-1) >> shifts) & 1
    return allowed.reshape(bits.shape[0], -1)[:, :width].bool()


def mask(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The logits with what the grammar refuses set to -inf (a new tensor)."""
    return logits.masked_fill(~allowed, float("-inf"))


class Grammars:
    """A service's grammars: the vocabulary (built on first use), compiled matchers by
    digest (copied per session) and each session's state."""

    def __init__(self, tokenizer: Callable[[], object], n_vocab: int, cached: int = 64):
        self._tokenizer = tokenizer
        self.n_vocab = n_vocab
        self._fresh: OrderedDict[int, object] = OrderedDict()
        self._cached = cached
        self._lock = threading.RLock()

    @property
    def vocabulary(self):
        try:
            with self._lock:  # one build (the warm-up thread and a first request)
                return vocabulary(self._tokenizer(), self.n_vocab)
        except Exception as e:  # noqa: BLE001 - e.g. a slow (Python) tokenizer
            raise InvalidArgument(f"this service cannot apply grammars: its tokenizer "
                                  f"does not convert for llguidance ({e})") from e

    def warm(self) -> threading.Thread:
        """Build the vocabulary in the background (about a second for a 150k
        vocabulary), so that the first constrained request does not pay it in its deadline."""
        def build():
            try:
                self.vocabulary  # noqa: B018 - cached
            except InvalidArgument as e:  # said again to each constrained request
                log.warning("%s", e)

        thread = threading.Thread(target=build, name="grammar-warm", daemon=True)
        thread.start()
        return thread

    def state(self, session, grammar: Grammar | None, prompt_len: int,
              starting: bool = False) -> GrammarState | None:
        """The session's matcher for this request's grammar (None without one), made when
        the grammar's text comes (a session's start, `starting`: keep_len 0); a request
        that names the grammar only by digest must find the session holding it, or is
        told to resync."""
        if grammar is None:
            session.grammar = None
            return None
        held = session.grammar
        if held is not None and held.grammar.digest == grammar.digest \
                and held.prompt_len == prompt_len:
            return held
        if not grammar.spec and grammar.kind != "json_object":
            session.grammar = None
            require(not starting, "sampling.grammar.spec is empty: a session starts "
                                  "(keep_len = 0) with the grammar's text; later requests "
                                  "may name it by digest alone")
            raise FailedPrecondition(
                f"session {session.session_id!r} holds no grammar with digest "
                f"{grammar.digest}; resend with keep_len = 0 and the grammar's text",
                cached_len=0)
        session.grammar = self.new_state(grammar, prompt_len)
        return session.grammar

    def new_state(self, grammar: Grammar, prompt_len: int) -> GrammarState:
        """A matcher for a generation whose prompt is prompt_len tokens long."""
        return GrammarState(grammar, self._matcher(grammar), prompt_len,
                            self.vocabulary.eos_tokens, self.n_vocab)

    def _matcher(self, grammar: Grammar):
        """The compiled matcher of `grammar`, before any token (cached by digest; callers
        copy it). Compiled once: a bad grammar is a matcher in its error state."""
        from llguidance import LLMatcher

        with self._lock:
            fresh = self._fresh.get(grammar.digest)
            if fresh is not None:
                self._fresh.move_to_end(grammar.digest)
                return fresh
        vocab = self.vocabulary
        error = "" if grammar.kind in KINDS else f"unknown grammar kind {grammar.kind!r}"
        if grammar.kind == "lark" and NO_ROLLBACK.search(grammar.spec):
            error = check(grammar)
        try:
            fresh = None if error else LLMatcher(vocab, grammar.llguidance(), log_level=0)
        except Exception as e:  # noqa: BLE001 - bad JSON, a GBNF the converter cannot read
            error = str(e) or type(e).__name__
        if fresh is not None and fresh.is_error():
            error = fresh.get_error()
        if error:
            raise InvalidArgument(f"sampling.grammar: {error}")
        with self._lock:
            self._fresh[grammar.digest] = fresh
            while len(self._fresh) > self._cached:
                self._fresh.popitem(last=False)
        return fresh
