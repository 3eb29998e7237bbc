"""A Python client for the coordinator's gRPC API (`specdec.v1.Generator`).

    from specdec.client import Client
    with Client("127.0.0.1:50050", timeout=60) as client:
        print(client.generate("The quick brown fox", max_new_tokens=32).text)
        for chunk in client.stream(messages=[("user", "Hello!")], temperature=0.7):
            print(chunk.text, end="", flush=True)

`AsyncClient` is the same on grpc.aio (`await client.generate(...)`, `async for chunk in
client.stream(...)`, `async with`). Results are frozen dataclasses (Completion, Chunk,
Stats, TokenKind); failures raise SpecdecAPIError subclasses carrying the gRPC code and
the server's message. Modules: types (results), convert (wire <-> results), request
(the options), errors, sync (Client), aio (AsyncClient).
"""

from specdec.client.aio import AsyncChunkStream, AsyncClient
from specdec.client.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    RequestCancelledError,
    ResourceExhaustedError,
    SpecdecAPIError,
    UnavailableError,
)
from specdec.client.request import DEFAULT_MAX_NEW_TOKENS, build_request
from specdec.client.sync import ChunkStream, Client
from specdec.client.types import Chunk, Completion, Stats, TokenKind

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS", "AsyncChunkStream", "AsyncClient", "Chunk", "ChunkStream",
    "Client", "Completion", "DeadlineExceededError", "FailedPreconditionError",
    "InternalError", "InvalidArgumentError", "NotFoundError", "RequestCancelledError",
    "ResourceExhaustedError", "SpecdecAPIError", "Stats", "TokenKind", "UnavailableError",
    "build_request",
]
