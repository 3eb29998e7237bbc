"""Shared fixtures: real draft and target servers on loopback ports with tiny models."""

from __future__ import annotations

import grpc
import pytest

from coordinator.clients import DraftClient, TargetClient
from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig


def _serve(create, cfg):
    server, port, engine = create(cfg)
    server.start()
    return server, f"127.0.0.1:{port}", engine


@pytest.fixture(scope="session")
def draft_server():
    server, address, engine = _serve(
        create_draft, DraftConfig(model="tiny-random-draft", port=0, max_sessions=32)
    )
    yield address, engine
    server.stop(0)


@pytest.fixture(scope="session")
def target_server():
    server, address, engine = _serve(
        create_target, TargetConfig(model="tiny-random", port=0, max_sessions=32)
    )
    yield address, engine
    server.stop(0)


@pytest.fixture()
def draft_channel(draft_server):
    with grpc.insecure_channel(draft_server[0]) as channel:
        yield channel


@pytest.fixture()
def target_channel(target_server):
    with grpc.insecure_channel(target_server[0]) as channel:
        yield channel


@pytest.fixture()
def draft_client(draft_channel):
    return DraftClient(draft_channel)


@pytest.fixture()
def target_client(target_channel):
    return TargetClient(target_channel)
