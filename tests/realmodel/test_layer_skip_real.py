"""SmolLM2 with a self-speculative draft, its own model minus six middle layers (draft
--skip-layers), through the real services on torch and OpenVINO: greedy K=4 equals
target-only, token for token."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.setup import build_service
from specdec import pair as pairs
from specdec.runtime.layer_skip import format_set
from tests.realmodel.conftest import greedy_k4_equals_target_only

pytestmark = [pytest.mark.realmodel, pytest.mark.slow, pytest.mark.long]

SKIP = (10, 12, 14, 16, 18, 20)  # teacher-forced greedy agreement 0.56 in fp32
PROMPTS = ["What is the capital of France? Answer in one sentence.",
           "Write a Python function that reverses a string."]
_TORCH = next(p for p in pairs.CANDIDATES if p.name == "torch-fp32 target + torch-int8 draft")
PAIRS = {
    "torch-int8": pairs.Pair("torch target + torch int8 layer-skip draft", _TORCH.target,
                             _TORCH.draft.with_(extra=_TORCH.draft.extra
                                                + ("--skip-layers", format_set(SKIP)))),
    "openvino-int8": pairs.Pair("ov target + ov int8 layer-skip draft",
                                pairs.DEFAULT_PAIR.target,
                                pairs.DEFAULT_PAIR.draft.with_(
                                    extra=("--skip-layers", format_set(SKIP)))),
}


@pytest.fixture(scope="module", params=list(PAIRS))
def service(prepared, request):
    if request.param.startswith("openvino"):
        from specdec.runtime.openvino_export import export

        export(prepared, "fp32")
        export(prepared, "int8", skip_layers=SKIP)  # cached after the first run
    with ExitStack() as stack:
        running = pairs.start(PAIRS[request.param], stack)
        service = build_service(CoordinatorConfig(draft=running.draft.address,
                                                  target=running.target.address))
        service.draft_address = running.draft.address
        yield service


def test_the_draft_reports_its_skip_set(service):
    import grpc

    from coordinator.remote.clients import DraftClient

    info = DraftClient(grpc.insecure_channel(service.draft_address)).info()
    assert tuple(info.skip_layers) == SKIP and info.model_id == "smollm2-135m"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_k4_equals_target_only(service, prompt):
    greedy_k4_equals_target_only(service, prompt)
