"""TLS on the client API: a TLS gRPC server and an HTTPS terminator in the coordinator's
driver process, in front of the Serve application.

Ray Serve's proxies cannot do it: its gRPC proxy listens in plaintext on every interface
(ray 2.60: `add_insecure_port("[::]:port")`), and its HTTP proxy takes a certificate only at
start, with no client certificates. So with `--api-tls-cert/--api-tls-key`:
- Serve's gRPC proxy is not started. This module's grpc.aio server listens on --port with
  specdec.tls.ServerTLS credentials (reloaded when the files change; mutual with
  --api-tls-client-ca) and serves specdec.v1.Generator, grpc.health.v1 and reflection.
  Each call goes to a coordinator replica through a Serve handle
  (`CoordinatorReplica.front_stream`), so Serve's routing and autoscaling apply as they do
  behind its own proxy; a client that goes away cancels the handle's call, which closes
  the generation and releases both sessions.
- Serve's HTTP proxy listens on loopback only, on a free port, and a
  specdec.tls_proxy.TLSTerminator listens on --http-host:--http-port.
So every port a remote client can reach speaks TLS; the metrics ports stay plaintext
(scraped inside the cluster) and are separate.

In a Kubernetes RayService this driver is not ours: there, client TLS ends at the Ingress
or Gateway in front of the Serve Service (see k8s/README.md).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator.api.auth import metadata_value
from coordinator.api.service import add_chunk
from specdec.grpc_server import Malformed, lenient, malformed_message
from specdec.tls import ServerTLS
from specdec.tls_proxy import TLSTerminator
from specdec.v1 import generate_pb2, generate_pb2_grpc

log = logging.getLogger("coordinator.deploy.front")

GRPC_HOST = "[::]"  # like Serve's own gRPC proxy: every interface


class GeneratorFront(generate_pb2_grpc.GeneratorServicer):
    """specdec.v1.Generator, each call forwarded to a replica's front_stream."""

    def __init__(self, handle):
        self._stream = handle.options(stream=True, method_name="front_stream")

    async def GenerateStream(self, request, context):  # noqa: N802 - RPC name
        from coordinator.deploy.app import FrontError

        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                malformed_message("GenerateStream", request))
        authorization = metadata_value(context.invocation_metadata())
        responses = self._stream.remote(request, authorization)
        try:
            async for item in responses:
                if isinstance(item, FrontError):
                    await context.abort(getattr(grpc.StatusCode, item.code), item.message)
                yield item
        finally:
            responses.cancel()  # no-op once it finished; else the replica closes it

    async def Generate(self, request, context):  # noqa: N802
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                malformed_message("Generate", request))
        response = generate_pb2.GenerateResponse()
        async for chunk in self.GenerateStream(request, context):
            add_chunk(response, chunk)
        return response


class HealthFront(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: SERVING when a replica answers its Check."""

    def __init__(self, handle):
        self._check = handle.options(method_name="Check")

    async def Check(self, request, context):  # noqa: N802
        try:
            return await self._check.remote(request)
        except Exception as exc:  # noqa: BLE001 - any failure means not serving
            log.warning("health check: no replica answered (%s)", exc)
            return health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.NOT_SERVING)

    async def Watch(self, request, context):  # noqa: N802
        yield await self.Check(request, context)
        while True:  # the status is fixed while the process lives
            await asyncio.sleep(3600)


def add_generator(front: GeneratorFront, server) -> None:
    """specdec.v1.Generator on `server`, with requests that do not parse handed to the
    methods as specdec.grpc_server.Malformed (INVALID_ARGUMENT) rather than failing in
    gRPC's deserializer (INTERNAL)."""
    parse = lenient(generate_pb2.GenerateRequest.FromString)
    handlers = {
        "Generate": grpc.unary_unary_rpc_method_handler(
            front.Generate, request_deserializer=parse,
            response_serializer=generate_pb2.GenerateResponse.SerializeToString),
        "GenerateStream": grpc.unary_stream_rpc_method_handler(
            front.GenerateStream, request_deserializer=parse,
            response_serializer=generate_pb2.GenerateChunk.SerializeToString),
    }
    name = generate_pb2.DESCRIPTOR.services_by_name["Generator"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (for Serve's HTTP proxy behind the terminator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TLSFront:
    """The TLS gRPC server and HTTPS terminator, on their own event loop in a thread."""

    def __init__(self, tls: ServerTLS, grpc_port: int, http_host: str = "",
                 http_port: int = 0, http_backend_port: int = 0):
        self.tls = tls
        self.grpc_port, self.http_host, self.http_port = grpc_port, http_host, http_port
        self.http_backend_port = http_backend_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front",
                                        daemon=True)
        self._server: grpc.aio.Server | None = None
        self._https: TLSTerminator | None = None

    def start(self, handle, timeout: float = 30.0) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(handle), self._loop).result(timeout)

    async def _start(self, handle) -> None:
        server = grpc.aio.server()
        add_generator(GeneratorFront(handle), server)
        health_pb2_grpc.add_HealthServicer_to_server(HealthFront(handle), server)
        names = [generate_pb2.DESCRIPTOR.services_by_name["Generator"].full_name,
                 health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server)
        bound = server.add_secure_port(f"{GRPC_HOST}:{self.grpc_port}", self.tls.credentials())
        if bound == 0:
            raise OSError(f"cannot listen on gRPC port {self.grpc_port} (in use?)")
        await server.start()
        self._server, self.grpc_port = server, bound
        if self.http_port > 0:
            self._https = TLSTerminator(self.tls, "127.0.0.1", self.http_backend_port)
            self.http_port = await self._https.start(self.http_host, self.http_port)
        log.info("client API over %s: gRPC on port %d%s", self.tls.summary(), bound,
                 f", HTTPS on {self.http_host}:{self.http_port}" if self._https else "")

    def stop(self, grace_s: float = 5.0) -> None:
        async def _stop():
            if self._https is not None:
                await self._https.close()
            if self._server is not None:
                await self._server.stop(grace_s)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(grace_s + 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
