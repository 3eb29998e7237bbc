"""Health, reflection and graceful shutdown of the real servers."""

from __future__ import annotations

import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from target_service.__main__ import create as create_target
from target_service.config import TargetConfig

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check(channel, service=""):
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_health_serving(draft_channel, target_channel):
    assert check(draft_channel) == SERVING
    assert check(draft_channel, "specdec.v1.DraftService") == SERVING
    assert check(target_channel, "specdec.v1.TargetService") == SERVING


def list_services(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (response,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    return {s.name for s in response.list_services_response.service}


def test_reflection_lists_the_services(draft_channel, target_channel):
    assert {"specdec.v1.DraftService", "grpc.health.v1.Health"} <= list_services(draft_channel)
    assert "specdec.v1.TargetService" in list_services(target_channel)


def test_shutdown_turns_not_serving_before_stopping():
    server, port, _ = create_target(TargetConfig(model="tiny-random", port=0))
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="specdec.v1.TargetService"),
                           timeout=10)
        assert next(watch).status == SERVING
        stopper = threading.Thread(target=server.stop, args=(2.0,))
        stopper.start()
        assert next(watch).status == NOT_SERVING
        stopper.join(10)
    assert not stopper.is_alive()
