"""The Responses API's store: stored responses and the conversations they end, shared by
every coordinator replica and kept across restarts.

The backend is one SQLite file (`--response-store PATH`; the default is
`$SPECDEC_HOME/responses.sqlite3`). Every replica opens the same file, so a conversation
continues through `previous_response_id` on whichever replica takes the next request,
and after any replica restarts. SQLite's write-ahead log lets the replicas read while
one writes. Replicas on several nodes need the file on a volume they all mount with
working POSIX locks (a ReadWriteMany volume in k8s; the overlay's note says which).

Bounded twice, both checked on every write:
- in age: a response older than `max_age_s` is gone (404), as OpenAI's expire;
- in number: past `max_entries`, the oldest go first.
A record over `max_record_bytes` is refused, and the response then says it was not
stored (`store: false`), rather than failing the generation.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 10_000
DEFAULT_MAX_AGE_S = 30 * 24 * 3600.0  # OpenAI keeps stored responses 30 days
DEFAULT_MAX_RECORD_BYTES = 4 * 1024 * 1024
_SCHEMA = """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, created REAL NOT NULL, record TEXT NOT NULL)"""


class ResponseStore:
    def __init__(self, path: str | Path, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_age_s: float = DEFAULT_MAX_AGE_S,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, clock=time.time):
        if max_entries < 1 or max_age_s <= 0:
            raise ValueError("the response store needs max_entries >= 1 and max_age_s > 0")
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_entries, self.max_age_s = max_entries, max_age_s
        self.max_record_bytes, self.clock = max_record_bytes, clock
        self._lock = threading.Lock()
        with closing(self._connect()) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
            db.execute("CREATE INDEX IF NOT EXISTS by_created ON responses (created)")

    def _connect(self) -> sqlite3.Connection:
        # a connection per call: replicas and threads never share one
        return sqlite3.connect(self.path, timeout=10.0, isolation_level=None)

    def put(self, response_id: str, record: dict) -> bool:
        """Keep `record` under `response_id`; False when it is too large to keep."""
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode()) > self.max_record_bytes:
            log.warning("response %s not stored: %d bytes is over the store's %d",
                        response_id, len(text.encode()), self.max_record_bytes)
            return False
        now = self.clock()
        with self._lock, closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?)",
                       (response_id, now, text))
            db.execute("DELETE FROM responses WHERE created < ?", (now - self.max_age_s,))
            db.execute("DELETE FROM responses WHERE id IN (SELECT id FROM responses "
                       "ORDER BY created DESC LIMIT -1 OFFSET ?)", (self.max_entries,))
            db.execute("COMMIT")
        return True

    def get(self, response_id: str) -> dict | None:
        """The record, or None when it is unknown, expired or evicted."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT created, record FROM responses WHERE id = ?",
                             (response_id,)).fetchone()
        if row is None or row[0] < self.clock() - self.max_age_s:
            return None
        return json.loads(row[1])

    def delete(self, response_id: str) -> bool:
        with self._lock, closing(self._connect()) as db:
            return db.execute("DELETE FROM responses WHERE id = ?",
                              (response_id,)).rowcount > 0

    def __len__(self) -> int:
        with closing(self._connect()) as db:
            return db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
