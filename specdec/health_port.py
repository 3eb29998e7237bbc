"""A plaintext port that serves only grpc.health.v1, for probes of a TLS service.

Kubernetes' gRPC probes (and most load balancers' health checks) speak plaintext, and a
model service with mutual TLS refuses any caller without a client certificate. So a
service started with `--health-port P` also answers grpc.health.v1.Health on P, in
plaintext, from the same HealthServicer as its TLS port: SERVING once the model is
loaded, NOT_SERVING from SIGTERM on. Nothing else is served there (no model RPC, no
reflection), so it reveals only whether the service is up.
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from grpc_health.v1 import health_pb2_grpc

log = logging.getLogger(__name__)


class HealthPort:
    def __init__(self, health_servicer, host: str, port: int):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2,
                                                             thread_name_prefix="health"),
                                  options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self.server)
        try:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot bind the health port {host}:{port}: address in use or "
                          "not available")

    def start(self) -> HealthPort:
        self.server.start()
        log.info("grpc.health.v1 only, plaintext, on port %d (for probes)", self.port)
        return self

    def stop(self) -> None:
        self.server.stop(0).wait()
