"""The errors a client raises: one class per common gRPC status, with the server's message.

Every failed call raises a `SpecdecAPIError` (never a bare `grpc.RpcError`), from the
sync and the async client alike, for unary calls and streams:

    try:
        client.generate("Hi", max_new_tokens=0)
    except InvalidArgumentError as e:
        print(e.status_name, e.message)  # INVALID_ARGUMENT max_new_tokens must be in ...
"""

from __future__ import annotations

import grpc


class SpecdecAPIError(Exception):
    """A call the server (or the channel) failed with a gRPC status.

    `code` is the grpc.StatusCode, `status_name` its name ("INVALID_ARGUMENT") and
    `message` the status details as the server sent them.
    """

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @property
    def status_name(self) -> str:
        return self.code.name


class InvalidArgumentError(SpecdecAPIError):
    """The request is malformed (the message names the field)."""


class NotFoundError(SpecdecAPIError):
    pass


class FailedPreconditionError(SpecdecAPIError):
    pass


class ResourceExhaustedError(SpecdecAPIError):
    """The coordinator is at its concurrency cap; retry later."""


class UnavailableError(SpecdecAPIError):
    """No server to talk to (not reachable, or its model services are down)."""


class DeadlineExceededError(SpecdecAPIError):
    """The call's timeout ran out before the generation finished."""


class RequestCancelledError(SpecdecAPIError):
    """The call was cancelled (by the server, or by the channel closing under it)."""


class InternalError(SpecdecAPIError):
    """The server failed in a way that is not the request's fault (see its log)."""


_BY_CODE: dict[grpc.StatusCode, type[SpecdecAPIError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: RequestCancelledError,
    grpc.StatusCode.INTERNAL: InternalError,
}


def error_for(code: grpc.StatusCode, message: str) -> SpecdecAPIError:
    """The SpecdecAPIError subclass for `code` (the base class for other codes)."""
    return _BY_CODE.get(code, SpecdecAPIError)(code, message)


def from_rpc_error(exc: grpc.RpcError) -> SpecdecAPIError:
    """The SpecdecAPIError for a failed sync or grpc.aio call."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    return error_for(code or grpc.StatusCode.UNKNOWN, details or "")
