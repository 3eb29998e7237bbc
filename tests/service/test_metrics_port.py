"""The --metrics-port setting: off by default, 0 serves nothing, a taken port."""

from __future__ import annotations

import logging
import socket
import urllib.error

import grpc
import pytest

import specdec.metrics
from coordinator.loop import SpeculativeLoop
from coordinator.remote.clients import TargetClient
from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from specdec.metrics import ModelMetrics, PrometheusModelMetrics
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig
from tests.service import _metrics_helpers
from tests.service._metrics_helpers import PROMPT, Delta, Samples

services = _metrics_helpers.services  # the shared fixture: servers for this module


class _NoServer:
    def shutdown(self):
        pass

    def server_close(self):
        pass


def test_metrics_port_zero_serves_nothing(monkeypatch):
    started = []

    def spy(*args):
        started.append(args)
        return _NoServer(), None

    monkeypatch.setattr(specdec.metrics, "start_http_server", spy)
    server, _, engine = create_draft(DraftConfig(model="tiny-random-draft", port=0))
    server.stop(0)
    assert started == []
    assert type(engine.model.metrics) is ModelMetrics and not engine.model.metrics.enabled
    with grpc.insecure_channel("127.0.0.1:1") as channel:
        assert not SpeculativeLoop(None, TargetClient(channel)).metrics.enabled
    # The spy sees a server started as soon as the port is not 0.
    server, _, engine = create_target(TargetConfig(model="tiny-random", port=0,
                                                   metrics_port=9))
    server.stop(0)
    engine.model.metrics.close()
    assert started == [(9, "127.0.0.1", engine.model.metrics.registry)]


def test_flags_default_to_off():
    from coordinator.deploy.config import from_args as coordinator_args
    from draft_service.config import from_args as draft_args
    from target_service.config import from_args as target_args

    for parse, base in ((draft_args, ["--model", "m"]), (target_args, ["--model", "m"]),
                        (coordinator_args, [])):
        assert parse(base).metrics_port == 0
        assert parse([*base, "--metrics-port", "9100"]).metrics_port == 9100


def test_a_taken_port_fails_a_model_service_or_moves_a_replica_on(services, caplog):
    """A model service treats a taken metrics port like a taken gRPC port (start-up
    error); a coordinator replica warns and takes the next free one."""
    host = "0.0.0.0"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"metrics on 127.0.0.1:{port}"):
            PrometheusModelMetrics("draft").serve(port, "127.0.0.1")

    from coordinator.deploy.app import CoordinatorReplica

    (d_addr, _), (t_addr, _) = services
    for _ in range(20):  # a free port whose successor is free too
        with socket.socket() as taken, socket.socket() as probe:
            taken.bind((host, 0))
            port = taken.getsockname()[1]
            try:
                probe.bind((host, port + 1))
            except OSError:
                continue
            probe.close()
            taken.listen()
            with caplog.at_level(logging.WARNING, logger="specdec.metrics"):
                replica = CoordinatorReplica(
                    {"draft": d_addr, "target": t_addr, "metrics_port": port})
            break
    else:
        pytest.fail("no two consecutive free ports")
    try:
        assert replica.metrics.port == port + 1
        assert replica.service.loop.metrics is replica.metrics
        assert any(f"metrics port {host}:{port} is taken" in r.getMessage()
                   for r in caplog.records)
        before = Samples(port + 1)
        from specdec.v1 import generate_pb2

        resp = replica.service.generate(generate_pb2.GenerateRequest(
            prompt_token_ids=PROMPT, max_new_tokens=8, num_draft_tokens=2))
        after = Samples(port + 1)
        delta = Delta(before, after)
        assert len(resp.token_ids) == 8
        assert delta("specdec_spec_decode_num_draft_tokens_total") == resp.stats.drafted_tokens
        assert (delta("specdec_spec_decode_num_accepted_tokens_total")
                == resp.stats.accepted_tokens)
        assert delta("specdec_coordinator_round_duration_seconds_count") == resp.stats.rounds
        assert delta("specdec_coordinator_generated_tokens_total") == 8
    finally:
        replica.__del__()
    with pytest.raises(urllib.error.URLError):
        Samples(port + 1)  # closed with the replica
