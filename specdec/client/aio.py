"""`AsyncClient`: the coordinator's Generator API on grpc.aio, for asyncio programs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Unpack

import grpc
import grpc.aio

from specdec.client.convert import chunk_from_proto, completion_from_proto
from specdec.client.errors import from_rpc_error
from specdec.client.request import GenerateOptions, build_request
from specdec.client.types import Chunk, Completion
from specdec.tls import ClientTLS
from specdec.v1 import generate_pb2_grpc


class AsyncChunkStream:
    """The chunks of one GenerateStream call, as an async iterator.

    The RPC starts at the first `__anext__`. `await stream.aclose()` (or cancel()),
    leaving an `async with` block, or dropping the last reference (breaking out of
    `async for chunk in client.stream(...)`) cancels the RPC. A failed call raises a
    SpecdecAPIError from the iteration; a cancelled task gets asyncio.CancelledError.
    """

    def __init__(self, start: Callable[[], grpc.aio.UnaryStreamCall]):
        self._start = start
        self._call = None
        self._done = False

    def __aiter__(self) -> AsyncChunkStream:
        return self

    async def __anext__(self) -> Chunk:
        if self._done:
            raise StopAsyncIteration
        if self._call is None:
            self._call = self._start()
        try:
            message = await self._call.read()
        except grpc.RpcError as e:
            self._done = True
            raise from_rpc_error(e) from e
        if message is grpc.aio.EOF:
            self._done = True
            raise StopAsyncIteration
        return chunk_from_proto(message)

    def cancel(self) -> None:
        """Cancel the RPC if it is still running; the stream then ends."""
        if self._call is not None and not self._done:
            self._call.cancel()
        self._done = True

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> AsyncChunkStream:
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.cancel()

    def __del__(self) -> None:  # an `async for` broken out of drops the last reference
        self.cancel()


class AsyncClient:
    """An asyncio client of a coordinator at `address` ("host:port", plaintext).

    The same options and errors as `Client`; create it inside the running event loop:

        async with AsyncClient("127.0.0.1:50050", timeout=60) as client:
            done = await client.generate("Once upon a time", max_new_tokens=32)
            async for chunk in client.stream(messages=[("user", "Hi!")]):
                print(chunk.text, end="")
    """

    def __init__(self, address: str, *, timeout: float | None = None,
                 metadata: Sequence[tuple[str, str]] = (),
                 channel_options: Sequence[tuple[str, object]] = (),
                 tls: ClientTLS | None = None):
        self.address = address
        self.timeout = timeout
        self._metadata = tuple(metadata) or None
        self._channel = grpc.aio.insecure_channel(address, options=list(channel_options)) \
            if tls is None else tls.aio_channel(address, channel_options)
        self._stub = generate_pb2_grpc.GeneratorStub(self._channel)

    async def generate(self, prompt: str | None = None, *, timeout: float | None = None,
                       **options: Unpack[GenerateOptions]) -> Completion:
        """Generate to the end and return the whole Completion."""
        request = build_request(prompt, **options)
        try:
            response = await self._stub.Generate(request, timeout=self._timeout(timeout),
                                                 metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e
        return completion_from_proto(response)

    def stream(self, prompt: str | None = None, *, timeout: float | None = None,
               **options: Unpack[GenerateOptions]) -> AsyncChunkStream:
        """Generate, yielding a Chunk per round as it comes (see AsyncChunkStream).

        Not a coroutine: `async for chunk in client.stream(...)`.
        """
        request = build_request(prompt, **options)  # bad options fail here, not later
        deadline = self._timeout(timeout)
        return AsyncChunkStream(lambda: self._stub.GenerateStream(request, timeout=deadline,
                                                                  metadata=self._metadata))

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    async def close(self) -> None:
        """Close the channel; calls still running on it are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
