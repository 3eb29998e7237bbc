"""Draft and target on the OpenVINO backend through the real servers: still exact."""

from __future__ import annotations

import os

import grpc
import pytest

from coordinator.clients import DraftClient, TargetClient
from coordinator.loop import SpeculativeLoop
from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig
from specdec.sampling import SamplingParams
from target_service.__main__ import create as create_target
from target_service.config import TargetConfig

PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99]]


@pytest.fixture(scope="module")
def ov_home(tmp_path_factory):
    old = os.environ.get("SPECDEC_HOME")
    os.environ["SPECDEC_HOME"] = str(tmp_path_factory.mktemp("specdec-home"))
    yield
    if old is None:
        os.environ.pop("SPECDEC_HOME")
    else:
        os.environ["SPECDEC_HOME"] = old


@pytest.fixture(scope="module")
def ov_servers(ov_home):
    servers = {}
    for name, create, cfg in [
        ("ov_target", create_target, TargetConfig(model="tiny-random", backend="openvino",
                                                  port=0, threads=1)),
        ("ov_draft", create_draft, DraftConfig(model="tiny-random-draft", backend="openvino",
                                               weights="int8", port=0, threads=1)),
    ]:
        server, port, engine = create(cfg)
        server.start()
        servers[name] = (server, f"127.0.0.1:{port}", engine)
    yield servers
    for server, _, _ in servers.values():
        server.stop(0)


def loop_over(draft_address, target_address):
    draft = DraftClient(grpc.insecure_channel(draft_address)) if draft_address else None
    return SpeculativeLoop(draft, TargetClient(grpc.insecure_channel(target_address)))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_openvino_target_k4_equals_k0(ov_servers, draft_server, prompt):
    loop = loop_over(draft_server[0], ov_servers["ov_target"][1])
    base = loop.generate(prompt, 40, SamplingParams(), 0)
    spec = loop.generate(prompt, 40, SamplingParams(), 4)
    assert spec.token_ids == base.token_ids
    assert 0 < spec.stats.accepted_tokens < spec.stats.drafted_tokens


@pytest.mark.parametrize("prompt", PROMPTS)
def test_openvino_draft_with_torch_target_equals_torch_alone(ov_servers, target_server, prompt):
    loop = loop_over(ov_servers["ov_draft"][1], target_server[0])
    base = loop_over(None, target_server[0]).generate(prompt, 40, SamplingParams(), 0)
    spec = loop.generate(prompt, 40, SamplingParams(), 4)
    assert spec.token_ids == base.token_ids
    assert spec.stats.accepted_tokens > 0


def test_openvino_services_report_their_backend(ov_servers, target_server):
    info = TargetClient(grpc.insecure_channel(ov_servers["ov_target"][1])).info()
    torch_info = TargetClient(grpc.insecure_channel(target_server[0])).info()
    assert (info.backend, info.device) == ("openvino", "CPU")
    assert info.tokenizer_digest == torch_info.tokenizer_digest  # a valid mixed pair
