"""The Ray Serve application: specdec.v1.Generator and grpc.health.v1 on Serve's gRPC proxy,
and the OpenAI-compatible HTTP API with the browser demo on Serve's HTTP proxy.

Why Serve's own gRPC ingress (and not a grpc.aio server forwarding to a handle): it is
what KubeRay's RayService exposes and scales, it brings reflection, and replicas are
added or removed by Serve's autoscaler on ongoing requests with no code of ours.

HTTP goes through Serve's FastAPI ingress (`serve.ingress`), as Serve documents it, so
a RayService exposes and scales it like the gRPC port; each route is one call into
coordinator.api.http_api, which runs the same GenerationService.

The deployment is a thin shell: each method runs GenerationService's blocking
generator one round at a time in a worker thread, maps domain errors to status codes
through `grpc_context`, and on client cancellation closes the generator (which
releases the draft and target sessions) once the round in flight has finished.

With `metrics_port` > 0 each replica serves its loop's Prometheus metrics itself
(specdec.metrics), on all interfaces like Serve's proxy; a port already taken (another
replica on the same node) is a warning and the next of port+1 .. port+7 is tried.
"""

# No `from __future__ import annotations` here: FastAPI reads the routes' parameter
# annotations (`request: Request`) as objects, after Serve rewrote them into methods.
import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, aclosing
from dataclasses import dataclass

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse
from grpc_health.v1 import health_pb2
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from coordinator.api.auth import APIKeys, metadata_value
from coordinator.api.bridge import close_after, next_in_thread
from coordinator.api.http_api import OpenAIFrontend, route_error
from coordinator.api.response_store import ResponseStore
from coordinator.api.responses_http import ResponsesFrontend
from coordinator.api.service import add_chunk
from specdec.errors import grpc_status
from specdec.metrics import PORT_TRIES, PrometheusLoopMetrics
from specdec.paths import default_home
from specdec.v1 import generate_pb2

log = logging.getLogger("coordinator")

SERVICER_FUNCTIONS = [
    "specdec.v1.generate_pb2_grpc.add_GeneratorServicer_to_server",
    "grpc_health.v1.health_pb2_grpc.add_HealthServicer_to_server",
]
APP_NAME = "specdec"
HEADROOM = 16  # requests a replica takes beyond --max-concurrency (max_ongoing_requests)
METRICS_HOST = "0.0.0.0"


@dataclass(frozen=True)
class FrontError:
    """A failed generation, as CoordinatorReplica.front_stream reports it: the name of a
    grpc.StatusCode and the message for the client."""

    code: str
    message: str


def _authorization(grpc_context) -> str | None:
    """The call's `authorization` metadata (None without one, or without a context)."""
    metadata = grpc_context.invocation_metadata() if grpc_context is not None else ()
    return metadata_value(metadata)


def _status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status of a failed generation; an INTERNAL one (a bug) is logged with its
    traceback."""
    code, message, _ = grpc_status(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("generation failed", exc_info=exc)
    return code, message


def _set_error(grpc_context, exc: BaseException) -> None:
    code, message = _status(exc)
    grpc_context.set_code(code)
    grpc_context.set_details(message)


def start_metrics(metrics_port: int, service) -> PrometheusLoopMetrics | None:
    """Serve the metrics of `service`'s loop when metrics_port > 0; None when off."""
    if metrics_port <= 0:
        return None
    metrics = PrometheusLoopMetrics()
    port = metrics.serve(metrics_port, METRICS_HOST, tries=PORT_TRIES)
    service.loop.metrics = metrics
    log.info("coordinator replica serves metrics at http://%s:%d/metrics", METRICS_HOST, port)
    return metrics


HTTP = FastAPI(title="specdec", summary="OpenAI-compatible API of a distributed "
               "speculative decoder (see GET /v1/models and /demo)")
# Unknown paths and wrong methods answer in OpenAI's error shape too, not FastAPI's.
HTTP.add_exception_handler(StarletteHTTPException, route_error)


class CoordinatorReplica:
    """One replica's state and methods; `Coordinator` below is this class as a Serve
    deployment with the FastAPI ingress (whose wrapper makes __init__ a coroutine, so
    tests build this plain class instead)."""

    def __init__(self, config: dict):
        from coordinator.deploy.config import CoordinatorConfig, with_environment
        from coordinator.deploy.setup import build_service

        logging.basicConfig(level=config.get("log_level", "INFO"))
        cfg = CoordinatorConfig(**with_environment(config))
        self.service = build_service(cfg)
        if cfg.expose_replicas:
            import ray

            self.service.served_by = (serve.get_replica_context().replica_id.unique_id,
                                      ray.util.get_node_ip_address())
        self.metrics = start_metrics(cfg.metrics_port, self.service)
        # A round blocks its thread for a whole Propose + Verify: asyncio's default pool
        # (min(32, CPUs + 4) threads: 6 on two cores) would serialise generations past
        # that many. One thread per admitted generation, and a few for closing.
        self.executor = ThreadPoolExecutor(max_workers=cfg.max_concurrency + 4,
                                           thread_name_prefix="round")
        self.auth = APIKeys.load(cfg.api_keys, cfg.api_key_concurrency) \
            if cfg.api_keys else None
        if self.auth is not None:
            log.info("client API needs a key: %d key(s) (%s)", len(self.auth.names),
                     ", ".join(self.auth.names))
        self.http = OpenAIFrontend(self.service, self.executor, cfg.request_timeout,
                                   self.auth)
        self.responses = ResponsesFrontend(self.http, ResponseStore(
            cfg.response_store or default_home() / "responses.sqlite3",
            cfg.response_store_max, cfg.response_store_max_age))

    def __del__(self):
        # Serve calls this when it retires the replica: free the metrics port.
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()

    # -- HTTP (OpenAI-compatible) -------------------------------------------------------

    @HTTP.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self.http.chat(request)

    @HTTP.post("/v1/completions")
    async def completions(self, request: Request):
        return await self.http.completions(request)

    @HTTP.post("/v1/responses")
    async def responses_create(self, request: Request):
        return await self.responses.create(request)

    @HTTP.get("/v1/responses/{response_id}")
    def responses_retrieve(self, response_id: str):
        return self.responses.retrieve(response_id)

    @HTTP.delete("/v1/responses/{response_id}")
    def responses_delete(self, response_id: str):
        return self.responses.delete(response_id)

    @HTTP.get("/v1/models")
    def models(self, request: Request):
        return self.http.models(request)

    @HTTP.get("/health")
    def health(self):
        return self.http.health()

    @HTTP.get("/demo")
    def demo(self):
        return self.http.demo()

    @HTTP.get("/")
    def root(self):
        return RedirectResponse("/demo")

    # -- gRPC ---------------------------------------------------------------------------

    async def _chunks(self, request, authorization: str | None, where: str):
        """The chunks of one generation, holding the caller's API-key slot (with
        --api-keys) until it ends. Closed early (a client went away), it closes the
        generation once the round in flight has finished, which releases both sessions."""
        pending: list = []
        chunks = None
        with ExitStack() as held:
            tenant = ""  # the API key's name: whose outputs the look-up may reuse
            if self.auth is not None:
                tenant = held.enter_context(self.auth.admit(authorization, where))
            try:
                chunks = self.service.stream(request, tenant=tenant)
                while (chunk := await next_in_thread(chunks, pending, self.executor)) \
                        is not None:
                    yield chunk
            finally:
                if chunks is not None:
                    await close_after(chunks, pending, self.executor)

    async def Generate(self, request, grpc_context=None):  # noqa: N802 - RPC name
        response = generate_pb2.GenerateResponse()
        try:
            async with aclosing(self._chunks(request, _authorization(grpc_context),
                                             "metadata")) as chunks:
                async for chunk in chunks:
                    add_chunk(response, chunk)
            return response
        except Exception as exc:  # noqa: BLE001 - every failure gets a status code
            _set_error(grpc_context, exc)
            return generate_pb2.GenerateResponse()

    async def GenerateStream(self, request, grpc_context=None):  # noqa: N802
        try:
            async with aclosing(self._chunks(request, _authorization(grpc_context),
                                             "metadata")) as chunks:
                async for chunk in chunks:
                    yield chunk
        except Exception as exc:  # noqa: BLE001 - every failure gets a status code
            # A stream applies grpc_context only with a message or an exception:
            # raise, and Serve keeps the code set here (instead of INTERNAL).
            _set_error(grpc_context, exc)
            raise

    async def front_stream(self, request, authorization: str | None = None):
        """GenerateStream for coordinator.deploy.front (the TLS gRPC server in the driver), called
        through a Serve handle: the chunks, then a `FrontError` in place of any failure
        (so its status code crosses Ray as data, not as a wrapped exception)."""
        try:
            async with aclosing(self._chunks(request, authorization, "metadata")) as chunks:
                async for chunk in chunks:
                    yield chunk
        except Exception as exc:  # noqa: BLE001 - every failure gets a status code
            code, message = _status(exc)
            yield FrontError(code.name, message)

    async def Check(self, request, grpc_context=None):  # noqa: N802
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(self, request, grpc_context=None):  # noqa: N802
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        while True:  # the status does not change while the replica lives
            await asyncio.sleep(3600)


Coordinator = serve.deployment(name="Coordinator", ray_actor_options={"num_cpus": 0})(
    serve.ingress(HTTP)(CoordinatorReplica))


def application(args: dict):
    """The bound Serve application, with the autoscaling config from its arguments.

    Also a Serve application builder: a RayService's serveConfigV2 can give
    `import_path: coordinator.deploy.app:application` and any subset of CoordinatorConfig's
    fields as `args`; defaults fill in the rest."""
    from coordinator.deploy.config import CoordinatorConfig

    config = CoordinatorConfig(**(args or {})).to_dict()
    autoscaling = {
        "min_replicas": config["min_replicas"],
        "max_replicas": config["max_replicas"],
        "target_ongoing_requests": config["target_ongoing_requests"],
        "upscale_delay_s": config["upscale_delay"],
        "downscale_delay_s": config["downscale_delay"],
        "look_back_period_s": config["autoscale_look_back"],
        "metrics_interval_s": min(10.0, config["autoscale_look_back"] / 2),
    }
    options = dict(autoscaling_config=autoscaling,
                   max_ongoing_requests=max_ongoing_requests(config["max_concurrency"]),
                   graceful_shutdown_timeout_s=config["graceful_shutdown_timeout"])
    if config["max_replicas_per_node"] > 0:
        options["max_replicas_per_node"] = config["max_replicas_per_node"]
    return Coordinator.options(**options).bind(config)


def max_ongoing_requests(max_concurrency: int) -> int:
    """Serve's per-replica cap: the generations plus HEADROOM. Health checks, model
    listings and the demo page count as ongoing requests too, and must still answer while
    every generation slot is taken; a generation past --max-concurrency must reach the
    replica to be refused (RESOURCE_EXHAUSTED / 429) rather than wait unseen in Serve's
    queue."""
    return max(1, max_concurrency) + HEADROOM
