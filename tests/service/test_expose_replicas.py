"""--expose-replicas: a generation's stats name the replicas that served it; without it,
no internal name reaches a client (gRPC stats and OpenAI usage alike)."""

from __future__ import annotations

import pytest

from coordinator.api.openai_responses import usage
from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.setup import build_service
from specdec.client.convert import stats_from_proto
from specdec.v1 import generate_pb2


def request() -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(prompt_token_ids=[5, 6, 7, 8], max_new_tokens=12,
                                        num_draft_tokens=3)


@pytest.mark.parametrize("expose", [True, False])
def test_stats_name_the_pinned_replicas_only_when_asked(draft_server, target_server, expose):
    draft, target = draft_server[0], target_server[0]
    service = build_service(CoordinatorConfig(draft=draft, target=target,
                                              expose_replicas=expose))
    stats = service.generate(request()).stats
    assert stats.drafted_tokens > 0
    if expose:
        assert list(stats.target_replicas) == [target]
        assert list(stats.draft_replicas) == [draft]
        assert stats.coordinator_replica == "" and stats.coordinator_node == ""  # no Serve
        assert usage(stats)["specdec"]["target_replicas"] == [target]
        assert stats_from_proto(stats).draft_replicas == (draft,)
    else:
        assert not stats.target_replicas and not stats.draft_replicas
        assert "target_replicas" not in usage(stats)["specdec"]
