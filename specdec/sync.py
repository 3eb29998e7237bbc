"""The cache-sync part of every stateful request (docs/design.md, "The cache-sync rule").

"Keep the first `keep_len` tokens of your cache, whose digest is `keep_digest`, drop
anything after them, then feed `new_tokens`." The coordinator builds one per call
(coordinator.remote.view.CacheView.plan); the servers check it against their session
(specdec.runtime.session). Propose and Verify arguments extend it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec import digest as digests


@dataclass
class SyncRequest:
    session_id: str
    keep_len: int
    keep_digest: int
    new_tokens: list[int] = field(default_factory=list)

    @property
    def fed_digest(self) -> int:
        """Digest of the whole prefix once new_tokens are fed (assuming keep_digest holds)."""
        return digests.digest(self.new_tokens, self.keep_digest)
