"""The draft as the amateur of contrastive decoding: its values on the expert's V_head.

Score follows the cache-sync rule, except that new_tokens may be empty (a read of
what the session holds). With n = keep_len + len(new_tokens) and h heads, heads[j]
asks about the token after the first n - h + 1 + j tokens. The rows come from the
session's kept logits (what an earlier Propose with keep_logits, or an earlier Score,
computed there) or, for any not kept, from one forward pass over the tokens from the
first missing position on: the session holds those ids, so the answer never depends on
what happened to be kept (docs/design.md, section 17).

A read-only Score (pipelined contrastive rounds) changes nothing: the session may hold
tokens past keep_len, the next round's pre-draft, and may still be busy with it. The
rows are then read beside that request as soon as it has computed them, or, once the
session is idle, read (recomputed if need be) without cropping it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec.contrastive import ContrastiveParams, amateur_values
from specdec.errors import Cancelled, require
from specdec.runtime.cached_model import CachedModel
from specdec.sync import SyncRequest


@dataclass
class ScoreArgs(SyncRequest):
    heads: list[list[int]] = field(default_factory=list)  # V_head's ids per position
    params: ContrastiveParams = field(default_factory=ContrastiveParams)
    read_only: bool = False  # read at keep_len; crop and feed nothing


@dataclass
class ScoreResult:
    values: list[torch.Tensor]  # float32 [h_j] per head
    cached_len: int
    next_token: int | None = None  # read-only: the token after keep_len, if known


class Amateur:
    """Score without gRPC, over the draft's CachedModel. `max_heads` bounds one request
    (max_draft_tokens + 1: a speculative round's K+1 positions), and the rows a session
    keeps: a round's and its pre-draft's."""

    poll_s = 0.001  # how often a read-only Score checks a busy session's rows

    def __init__(self, model: CachedModel, max_heads: int):
        self.model, self.max_heads = model, max_heads
        self.max_rows = 2 * max_heads  # rows a session keeps

    def validate(self, args: ScoreArgs) -> None:
        h = len(args.heads)
        require(h <= self.max_heads, f"heads: at most {self.max_heads} positions per request "
                                     f"(max_draft_tokens + 1), got {h}")
        self.model.check_sync(args, feed=False)
        require(not (args.read_only and args.new_tokens),
                "read_only: new_tokens must be empty (a read-only Score feeds nothing)")
        n = args.keep_len + len(args.new_tokens)
        require(n >= 1, "nothing to score: keep_len = 0 and no new_tokens")
        require(h <= n, f"{h} heads ask about positions before the first token: the "
                        f"sequence is only {n} tokens long")
        for j, ids in enumerate(args.heads):
            require(len(ids) >= 1, f"heads[{j}].token_ids must not be empty")
            self.model.check_tokens(ids, f"heads[{j}].token_ids")
            require(len(set(ids)) == len(ids), f"heads[{j}].token_ids has duplicates")
        args.params.validate()

    def score(self, args: ScoreArgs, cancelled: Callable[[], bool] = lambda: False,
              busy_wait_s: float = 0.0) -> ScoreResult:
        self.validate(args)
        if cancelled():
            raise Cancelled("the client called this request off")
        n = args.keep_len + len(args.new_tokens)
        wanted = range(n - len(args.heads), n)  # prefix lengths, one per head (0-based)
        if args.read_only:
            beside = self._read_beside(args, wanted, busy_wait_s)
            if beside is not None:
                return beside
        with self.model.store.use(args.session_id, args.keep_len, args.keep_digest, n,
                                  busy_wait_s=busy_wait_s) as s:
            if not args.read_only:
                self.model.crop(s, args.keep_len)
            if args.new_tokens:
                logits = self.model.feed(s, args.new_tokens, len(args.new_tokens), cancelled)
                s.state.keep_rows(args.keep_len + 1, logits, self.max_rows)
            missing = [m + 1 for m in wanted if m + 1 not in s.state.rows]
            if missing:
                # Recompute from the first missing row on: feed tokens[first - 1:] again.
                first = missing[0]
                tail = s.tokens[first - 1:]
                self.model.crop(s, first - 1)
                logits = self.model.feed(s, tail, len(tail), cancelled)
                s.state.keep_rows(first, logits, self.max_rows)
            values = [amateur_values(s.state.rows[m + 1], torch.tensor(ids), args.params)
                      for m, ids in zip(wanted, args.heads, strict=True)]
            return ScoreResult(values, s.cached_len,
                               _next_token(s, args.keep_len) if args.read_only else None)

    def _read_beside(self, args: ScoreArgs, wanted: range,
                     busy_wait_s: float) -> ScoreResult | None:
        """The values from a busy session's rows, read as soon as the request holding it
        has computed them and drawn its next token; None once the session is idle (the
        caller checks it out and validates it, which gives any error). Waiting on a busy
        session is bounded by `busy_wait_s`, as for a check-out."""
        store, deadline = self.model.store, time.monotonic() + busy_wait_s
        while True:
            s, busy = store.peek(args.session_id)
            if not busy:
                return None
            rows = self._rows_of(s, args.keep_len, args.keep_digest, wanted)
            following = _next_token(s, args.keep_len)
            if rows is not None and following is not None:
                values = [amateur_values(r, torch.tensor(ids), args.params)
                          for r, ids in zip(rows, args.heads, strict=True)]
                return ScoreResult(values, s.cached_len, following)
            if time.monotonic() >= deadline:
                return None  # the check-out waits no more and answers ABORTED
            time.sleep(self.poll_s)

    @staticmethod
    def _rows_of(s, keep_len: int, keep_digest: int, wanted: range) -> list | None:
        """The kept rows after each of the `wanted` prefix lengths of a busy session, if it
        holds them for this prefix: a row is a function of the tokens before it, and the
        digest is read before and after the rows, so a row is never paired with other
        tokens than the request's."""
        def matches() -> bool:
            try:  # the request holding the session may be cropping it right now
                return s.cached_len >= keep_len and s.digest_of(keep_len) == keep_digest
            except IndexError:
                return False
        if not matches():
            return None
        rows = [s.state.rows.get(m + 1) for m in wanted]
        if any(r is None for r in rows) or not matches():
            return None
        return rows


def _next_token(s, keep_len: int) -> int | None:
    """The token after the first keep_len the session holds, or that its request drew
    there and is about to feed; None if neither (read beside that request)."""
    drawn = s.state.next_token
    try:
        if s.cached_len > keep_len:
            return s.tokens[keep_len]
    except IndexError:  # cropped meanwhile
        return None
    return drawn[1] if drawn is not None and drawn[0] == keep_len else None
