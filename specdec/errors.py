"""Domain errors and the one place where they become gRPC status codes.

Engines raise these; they know nothing of gRPC. The server interceptor
(`specdec.grpc_server`) turns each into its status code, its message and optional
trailing metadata (e.g. the server's `cached_len` on a cache-sync failure).
"""

from __future__ import annotations


class SpecdecError(Exception):
    """Base class. `code` names a `grpc.StatusCode` member."""

    code = "INTERNAL"

    def __init__(self, message: str, **metadata: object):
        super().__init__(message)
        self.message = message
        # Sent as trailing metadata "specdec-<key>" so callers can act without parsing text.
        self.metadata = {k: str(v) for k, v in metadata.items()}


class InvalidArgument(SpecdecError):
    code = "INVALID_ARGUMENT"


class NotFound(SpecdecError):
    code = "NOT_FOUND"


class FailedPrecondition(SpecdecError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(SpecdecError):
    code = "RESOURCE_EXHAUSTED"


class Aborted(SpecdecError):
    """A concurrent request holds the same session; retry once it has finished."""

    code = "ABORTED"


class Cancelled(SpecdecError):
    """The client called the request off before the server started on it."""

    code = "CANCELLED"


class Unauthenticated(SpecdecError):
    """No or a wrong API key on the client API."""

    code = "UNAUTHENTICATED"


class Unavailable(SpecdecError):
    code = "UNAVAILABLE"


class DeadlineExceeded(SpecdecError):
    code = "DEADLINE_EXCEEDED"


def grpc_status(exc: BaseException):
    """(grpc.StatusCode, message, trailing metadata) for any exception.

    Unknown exceptions become INTERNAL with their type name only: tracebacks stay in
    the server log.
    """
    import grpc

    if isinstance(exc, SpecdecError):
        metadata = tuple((f"specdec-{k.replace('_', '-')}", v) for k, v in exc.metadata.items())
        return getattr(grpc.StatusCode, exc.code), exc.message, metadata
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see server log", ()


def require(condition: bool, message: str) -> None:
    """Raise InvalidArgument(message) unless condition holds."""
    if not condition:
        raise InvalidArgument(message)
