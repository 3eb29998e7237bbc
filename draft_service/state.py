"""What the draft service keeps per session beside its KV cache (Session.state): the
amateur's logits rows, the token its last Propose drew, and an on-the-fly skipping
draft's last round. The shared runtime holds only what both services need."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DraftState:
    # Logits kept for a later Score (the amateur's rows in contrastive decoding): the
    # row for the token after the first n cached tokens, by n. Only what a request asked
    # to keep; a truncate drops the rows past its length, as it drops those positions.
    rows: dict[int, Any] = field(default_factory=dict)
    # (n, x): the draft's request drew x after the first n tokens (fed, or about to be).
    next_token: tuple[int, int] | None = None
    # An on-the-fly skipping draft's last round: (m, first drafted position, drafted
    # tokens, when it was proposed); draft_service.engine reads its outcome next time.
    drafted_with: tuple | None = None

    def truncate(self, length: int) -> None:
        """The session forgot the positions from `length` on (Session.truncate)."""
        for n in [n for n in self.rows if n > length]:
            del self.rows[n]

    def keep_rows(self, first: int, logits, limit: int) -> None:
        """Keep logits[i] as the row after the first `first + i` tokens; at most `limit`
        rows stay, the latest."""
        for i, row in enumerate(logits):
            self.rows[first + i] = row.float().clone()
        for n in sorted(self.rows)[:-limit] if len(self.rows) > limit else ():
            del self.rows[n]
