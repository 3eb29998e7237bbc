"""`Client`: the coordinator's Generator API over a blocking gRPC channel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Unpack

import grpc

from specdec.client.convert import chunk_from_proto, completion_from_proto
from specdec.client.errors import from_rpc_error
from specdec.client.request import GenerateOptions, build_request
from specdec.client.types import Chunk, Completion
from specdec.tls import ClientTLS, open_channel
from specdec.v1 import generate_pb2_grpc


class ChunkStream:
    """The chunks of one GenerateStream call, as an iterator.

    The RPC starts at the first next(). close(), leaving a `with` block, or dropping the
    last reference (breaking out of `for chunk in client.stream(...)`) cancels the RPC,
    and the server stops generating. A failed call raises a SpecdecAPIError from next().
    """

    def __init__(self, start: Callable[[], grpc.Call]):
        self._start = start
        self._call = None
        self._done = False

    def __iter__(self) -> ChunkStream:
        return self

    def __next__(self) -> Chunk:
        if self._done:
            raise StopIteration
        if self._call is None:
            self._call = self._start()
        try:
            return chunk_from_proto(next(self._call))
        except StopIteration:
            self._done = True
            raise
        except grpc.RpcError as e:
            self._done = True
            raise from_rpc_error(e) from e

    def close(self) -> None:
        """Cancel the RPC if it is still running; the stream then ends."""
        if self._call is not None and not self._done:
            self._call.cancel()
        self._done = True

    def __enter__(self) -> ChunkStream:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:  # a loop broken out of drops the last reference
        self.close()


class Client:
    """A blocking client of a coordinator at `address` ("host:port").

    timeout: deadline in seconds of every call (None = none) unless a call gives its
    own. metadata: (key, value) pairs sent with every call. channel_options: gRPC
    channel arguments, e.g. [("grpc.max_receive_message_length", 2**24)]. tls: a
    specdec.tls.ClientTLS for a coordinator started with --api-tls-cert, e.g.
    `client_tls(ca="certs/ca.pem")` (None = plaintext).

        with Client("127.0.0.1:50050", timeout=60) as client:
            done = client.generate("Once upon a time", max_new_tokens=32)
            print(done.text, done.stats.acceptance_rate)

    The options of generate() and stream() are build_request()'s
    (specdec.client.request): one of prompt / messages / prompt_token_ids,
    max_new_tokens, temperature, top_p, top_k, seed, stop, num_draft_tokens. A failed
    call raises a SpecdecAPIError subclass (InvalidArgumentError, ...). One client may
    serve many threads at once.
    """

    def __init__(self, address: str, *, timeout: float | None = None,
                 metadata: Sequence[tuple[str, str]] = (),
                 channel_options: Sequence[tuple[str, object]] = (),
                 tls: ClientTLS | None = None):
        self.address = address
        self.timeout = timeout
        self._metadata = tuple(metadata) or None
        self._channel = open_channel(address, channel_options, tls)
        self._stub = generate_pb2_grpc.GeneratorStub(self._channel)

    def generate(self, prompt: str | None = None, *, timeout: float | None = None,
                 **options: Unpack[GenerateOptions]) -> Completion:
        """Generate to the end and return the whole Completion."""
        request = build_request(prompt, **options)
        try:
            response = self._stub.Generate(request, timeout=self._timeout(timeout),
                                           metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e
        return completion_from_proto(response)

    def stream(self, prompt: str | None = None, *, timeout: float | None = None,
               **options: Unpack[GenerateOptions]) -> ChunkStream:
        """Generate, yielding a Chunk per round as it comes (see ChunkStream)."""
        request = build_request(prompt, **options)  # bad options fail here, not later
        deadline = self._timeout(timeout)
        return ChunkStream(lambda: self._stub.GenerateStream(request, timeout=deadline,
                                                             metadata=self._metadata))

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def close(self) -> None:
        """Close the channel; calls still running on it end with RequestCancelledError."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
