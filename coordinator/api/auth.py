"""API keys for the client API (gRPC `authorization` metadata, HTTP `Authorization`).

`--api-keys FILE` names a file (a Kubernetes Secret mounted as a file works as is) with one
key per line, optionally named: `name:key` (the name is what logs and metrics show; a key
never is). Blank lines and `#` comments are skipped. Keys are held only as SHA-256 digests,
and a presented key is compared against every digest with `hmac.compare_digest`, so
neither the stored keys nor the timing of a comparison reveal a key.

A caller sends `authorization: Bearer <key>` (gRPC metadata) or `Authorization: Bearer
<key>` (HTTP header). A missing or wrong key is UNAUTHENTICATED (HTTP 401) with a message
naming what to send. `--api-key-concurrency N` caps each key's generations at once per
coordinator replica: past it RESOURCE_EXHAUSTED (HTTP 429). Health checks, the demo page
and the metrics ports need no key.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdec.errors import ResourceExhausted, Unauthenticated

MIN_KEY_CHARS = 16


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class APIKeys:
    def __init__(self, keys: dict[str, str], max_concurrency: int = 0):
        """keys: name -> key. max_concurrency: generations at once per key (0 = no cap)."""
        if not keys:
            raise ValueError("no API keys given")
        self._digests = [(name, _digest(key)) for name, key in keys.items()]
        self.max_concurrency = max_concurrency
        self._active: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, max_concurrency: int = 0) -> APIKeys:
        """Read a key file; ValueError naming the line for anything malformed (never the
        key itself)."""
        keys: dict[str, str] = {}
        seen: set[bytes] = set()
        text = Path(path).read_text(encoding="utf-8")
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, key = line.partition(":")
            if not sep:
                name, key = f"key-{number}", line
            name, key = name.strip(), key.strip()
            if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
                raise ValueError(f"{path}, line {number}: a key must be at least "
                                 f"{MIN_KEY_CHARS} characters with no spaces")
            if name in keys or _digest(key) in seen:
                raise ValueError(f"{path}, line {number}: key name {name!r} or its key "
                                 "appears twice")
            keys[name] = key
            seen.add(_digest(key))
        if not keys:
            raise ValueError(f"{path} holds no API keys (one per line, optionally name:key)")
        return cls(keys, max_concurrency)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._digests]

    def identify(self, authorization: str | None, where: str) -> str:
        """The name of the key in an `authorization` value; UNAUTHENTICATED otherwise.
        `where` says how the key is sent ("metadata" or "header") in the message."""
        how = f"send your API key as 'authorization: Bearer <key>' {where}"
        if not authorization:
            raise Unauthenticated(f"this server needs an API key: {how}")
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthenticated(f"the authorization {where} is not 'Bearer <key>': {how}")
        presented = _digest(key.strip())
        match = None
        for name, digest in self._digests:  # every digest, whichever matches
            if hmac.compare_digest(presented, digest):
                match = name
        if match is None:
            raise Unauthenticated(f"the API key is not valid: {how}")
        return match

    @contextmanager
    def admit(self, authorization: str | None, where: str) -> Iterator[str]:
        """Identify the key and hold one of its generation slots while the block runs."""
        name = self.identify(authorization, where)
        with self._lock:
            if self.max_concurrency and self._active.get(name, 0) >= self.max_concurrency:
                raise ResourceExhausted(
                    f"API key {name!r} already runs {self.max_concurrency} generations at "
                    "once (the per-key limit); retry when one has finished")
            self._active[name] = self._active.get(name, 0) + 1
        try:
            yield name
        finally:
            with self._lock:
                self._active[name] -= 1


def metadata_value(invocation_metadata, key: str = "authorization") -> str | None:
    """One value of a gRPC call's metadata ((key, value) pairs), case-insensitive."""
    for k, v in invocation_metadata or ():
        if k.lower() == key:
            return v
    return None
