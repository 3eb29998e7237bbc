"""A real coordinator (Ray Serve, subprocess) in front of real tiny-model services."""

from __future__ import annotations

import socket
import time

import grpc
import openai
import pytest

from specdec.launcher import start
from specdec.v1 import generate_pb2_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BIND_FAILED = "Failed to bind to address"  # Serve's gRPC proxy, when its port was taken
START_TRIES = 3


def start_coordinator(args: list[str], timeout: float = 180):
    """Start the coordinator with `args` on two free ports (gRPC, HTTP): (process, gRPC
    port, HTTP port). A port free when chosen can be taken before Serve binds it (Ray's
    own processes, in this or another test worker, pick ports too); such a start is
    tried again on new ports, up to START_TRIES times. Any other failure raises."""

    def attempt():
        port, http_port = free_port(), free_port()
        proc = start("coordinator", [*args, "--port", str(port), "--http-port",
                                     str(http_port)], timeout=timeout)
        return proc, port, http_port

    for _ in range(START_TRIES - 1):
        try:
            return attempt()
        except RuntimeError as e:
            if BIND_FAILED not in str(e):
                raise
    return attempt()


@pytest.fixture(scope="session")
def coordinator(draft_server, target_server):
    """(gRPC address, draft engine, target engine, HTTP base URL); one Ray Serve
    coordinator for the session."""
    proc, _, http_port = start_coordinator(["--draft", draft_server[0], "--target",
                                            target_server[0], "--max-concurrency", "4"])
    yield proc.address, draft_server[1], target_server[1], f"http://127.0.0.1:{http_port}"
    assert proc.stop() == 0, proc.output[-3000:]


@pytest.fixture()
def generator_stub(coordinator):
    with grpc.insecure_channel(coordinator[0]) as channel:
        yield generate_pb2_grpc.GeneratorStub(channel)


def sessions_released(draft_engine, target_engine, within_s: float = 3.0) -> bool:
    """Both services hold no session within `within_s` (a released generation frees its
    sessions in ~0.1 s; an uncancelled one in the release tests runs ~6 s)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if len(draft_engine.model.store) == 0 and len(target_engine.model.store) == 0:
            return True
        time.sleep(0.05)
    return False


# The official `openai` package against the coordinator's HTTP API, and the model it serves.
@pytest.fixture(scope="session")
def client(coordinator):
    with openai.OpenAI(base_url=coordinator[3] + "/v1", api_key="unused", max_retries=0,
                       timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def model(client) -> str:
    (card,) = client.models.list().data
    return card.id
