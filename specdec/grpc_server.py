"""A gRPC server with what every specdec service needs.

`build_server(address, services)` returns the server and its bound port (bind
"127.0.0.1:0" to get a free one). It adds grpc.health.v1 and reflection, message size
limits, a concurrency cap (RESOURCE_EXHAUSTED past it, from gRPC itself), and an
interceptor that turns specdec's domain errors into status codes (errors.py). With
`tls` (specdec.tls.ServerTLS) the port serves TLS, or mTLS, with certificates that reload
when their files change; health and reflection are on the same port either way. `stop`
marks every service NOT_SERVING before stopping with a grace period;
`serve_until_signal` does that on SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specdec.errors import DeadlineExceeded, grpc_status
from specdec.tls import ServerTLS

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# A call without a deadline waits at most this long for a busy session.
MAX_BUSY_WAIT_S = 30.0


@dataclass(frozen=True)
class Service:
    """A servicer, its generated `add_*_to_server` function and its full name."""

    add_to_server: Callable[[Any, grpc.Server], None]
    servicer: Any
    name: str  # e.g. "specdec.v1.DraftService"


class ErrorMappingInterceptor(grpc.ServerInterceptor):
    """SpecdecError -> its status code and message; anything else -> INTERNAL, logged.
    A request whose bytes do not parse as its message (garbage, a string field that is
    not UTF-8) is INVALID_ARGUMENT, not gRPC's own INTERNAL "Exception deserializing
    request!"."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_guard_unary(handler.unary_unary, method),
                                    request_deserializer=lenient(handler.request_deserializer))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_guard_stream(handler.unary_stream, method),
                                    request_deserializer=lenient(handler.request_deserializer))
        return handler


@dataclass(frozen=True)
class Malformed:
    """What a request that failed to parse becomes; the guarded method answers it with
    INVALID_ARGUMENT instead of running."""

    reason: str


def lenient(deserialize):
    if deserialize is None:
        return None

    def parse(data: bytes):
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and the like
            return Malformed(f"{type(exc).__name__}: {exc}")

    return parse


def malformed_message(method: str, request: Malformed) -> str:
    """The INVALID_ARGUMENT message for a request that did not parse."""
    return (f"{method}: the request is not a valid protobuf message of its type (e.g. "
            f"truncated, or a string field that is not UTF-8): {request.reason}")


def _refuse_malformed(request, context, method: str) -> None:
    if isinstance(request, Malformed):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, malformed_message(method, request))


def _abort(exc: Exception, context: grpc.ServicerContext, method: str):
    code, message, metadata = grpc_status(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    if metadata:
        context.set_trailing_metadata(metadata)
    context.abort(code, message)


def _already_aborted(context) -> bool:
    return context.code() not in (None, grpc.StatusCode.OK)


def _check_deadline(context) -> None:
    """Skip work whose caller has already given up (e.g. it waited in the queue)."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise DeadlineExceeded("deadline expired before the server started the call")


def busy_wait_s(context: grpc.ServicerContext) -> float:
    """How long a call may wait for a session another request holds: what is left of its
    deadline (the one busy-session rule: the server waits, the client never polls)."""
    remaining = context.time_remaining()
    return MAX_BUSY_WAIT_S if remaining is None else max(0.0, min(remaining, MAX_BUSY_WAIT_S))


# Items a batch call (ProposeBatch, VerifyBatch) may carry.
MAX_BATCH_ITEMS = 256


def batch_items(items, convert) -> tuple[list, list]:
    """A batch request's items as engine arguments: (args, errors), one of each per item,
    in order; an item that does not convert has None for its args and its error (the
    item's own INVALID_ARGUMENT), the others are unaffected."""
    from specdec.errors import InvalidArgument, require

    require(len(items) <= MAX_BATCH_ITEMS,
            f"a batch holds at most {MAX_BATCH_ITEMS} items, got {len(items)}; split it")
    args: list = []
    errors: list = []
    for i, item in enumerate(items):
        try:
            args.append(convert(item))
            errors.append(None)
        except InvalidArgument as exc:
            args.append(None)
            errors.append(InvalidArgument(f"items[{i}]: {exc.message}"))
    return args, errors


def answer_batch(request, convert, run, to_response, response):
    """A batch RPC's answer: each item converted (`convert`, an item that does not
    convert gets its INVALID_ARGUMENT), the rest run together (`run`, a list of engine
    arguments -> a result or an exception per item), and each outcome put in the
    `response` message in order: `to_response(result)` or the item's ItemError."""
    args, errors = batch_items(request.items, convert)
    results = iter(run([a for a in args if a is not None]))
    for error in errors:
        item = response.items.add()
        outcome = error if error is not None else next(results)
        if isinstance(outcome, Exception):
            item.error.CopyFrom(item_error(outcome))
        else:
            item.result.CopyFrom(to_response(outcome))
    return response


def item_error(exc: BaseException):
    """The ItemError of one failed batch item: its status as a call of its own would
    have had it (a resync error carries what the session holds)."""
    from specdec.v1 import common_pb2

    code, message, metadata = grpc_status(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.error("a batch item failed: %s", message, exc_info=exc)
    error = common_pb2.ItemError(code=code.value[0], message=message)
    for key, value in metadata:
        if key == "specdec-cached-len":
            error.cached_len = int(value)
    return error


def _guard_unary(behavior, method):
    def guarded(request, context):
        _refuse_malformed(request, context, method)
        try:
            _check_deadline(context)
            return behavior(request, context)
        except Exception as exc:
            if _already_aborted(context):
                raise
            _abort(exc, context, method)

    return guarded


def _guard_stream(behavior, method):
    def guarded(request, context):
        _refuse_malformed(request, context, method)
        try:
            _check_deadline(context)
            yield from behavior(request, context)
        except Exception as exc:
            if _already_aborted(context):
                raise
            _abort(exc, context, method)

    return guarded


class SpecdecServer:
    def __init__(self, server: grpc.Server, health_servicer, names: Sequence[str],
                 tls: ServerTLS | None = None):
        self.grpc = server
        self.tls = tls
        self.health = health_servicer
        self.names = list(names)
        self._stopped = threading.Event()

    def set_serving(self, serving: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ["", *self.names]:
            self.health.set(name, status)

    def start(self) -> None:
        self.grpc.start()
        self.set_serving(True)

    def stop(self, grace: float = 5.0) -> None:
        """NOT_SERVING first (load balancers drain), then stop, letting RPCs finish."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.set_serving(False)
        self.grpc.stop(grace).wait()

    def wait(self) -> None:
        self.grpc.wait_for_termination()


def build_server(
    address: str,
    services: Sequence[Service],
    max_workers: int = 128,
    max_concurrent_rpcs: int | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    tls: ServerTLS | None = None,
) -> tuple[SpecdecServer, int]:
    """A server bound to `address` ("host:port"; port 0 = any free one), not started.

    Concurrent RPCs are capped at the worker count by default: a request blocks its
    worker while its steps wait for the model, so calls past the workers would only
    queue unseen; they get RESOURCE_EXHAUSTED instead."""
    if max_concurrent_rpcs is None:
        max_concurrent_rpcs = max_workers
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
        interceptors=[ErrorMappingInterceptor()],
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    for svc in services:
        svc.add_to_server(svc.servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [svc.name for svc in services]
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME],
        server,
    )
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.credentials())
    except RuntimeError as exc:
        raise OSError(f"cannot bind {address}: address in use or not available") from exc
    if port == 0:
        raise OSError(f"cannot bind {address}: address in use or not available")
    if tls is not None:
        log.info("port %d serves %s", port, tls.summary())
    wrapper = SpecdecServer(server, health_servicer, names, tls)
    wrapper.set_serving(False)
    return wrapper, port


def serve_until_signal(server: SpecdecServer, grace: float = 5.0,
                       on_ready: Callable[[], None] | None = None) -> None:
    """Start, serve until SIGTERM/SIGINT, then drain gracefully.

    The handlers are installed before the server starts and before `on_ready` runs
    (it logs "ready"), so a supervisor that signals as soon as it reads that line
    always gets the graceful path, never the default SIGTERM action.
    """
    def on_signal(signum, _frame):
        log.info("received %s: NOT_SERVING, draining for up to %.0f s",
                 signal.Signals(signum).name, grace)
        threading.Thread(target=server.stop, args=(grace,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    if on_ready is not None:
        on_ready()
    server.wait()
    log.info("stopped")
