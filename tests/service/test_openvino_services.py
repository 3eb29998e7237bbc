"""Draft and target on the OpenVINO backend through the real servers: still exact."""

from __future__ import annotations

from contextlib import ExitStack

import grpc
import pytest

from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from coordinator.remote.clients import DraftClient, TargetClient
from specdec import pair as pairs
from specdec.sampling import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99]]


@pytest.fixture(scope="module")
def ov_servers(tmp_home):
    """The default pair's services (OpenVINO target, int8 OpenVINO draft) on the tiny
    models, as processes."""
    pair = pairs.DEFAULT_PAIR.with_models("tiny-random", "tiny-random-draft")
    with ExitStack() as stack:
        running = pairs.start(pair, stack, pin=False, timeout=120)
        yield {"ov_target": (running.target, running.target.address, None),
               "ov_draft": (running.draft, running.draft.address, None)}


def loop_over(draft_address, target_address):
    draft = DraftClient(grpc.insecure_channel(draft_address)) if draft_address else None
    return SpeculativeLoop(draft, TargetClient(grpc.insecure_channel(target_address)),
                           LoopPolicy(pipeline=False))


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


class Driver:
    """One session's rounds: all drafts 'accepted' plus a fixed bonus, so the cache grows
    and each request crops and extends it as the cache-sync rule says."""

    def __init__(self, session: str, prompt: list[int]):
        self.session, self.committed, self.view = session, list(prompt), []

    def request(self):
        from specdec import digest
        from specdec.v1 import draft_pb2

        keep = 0
        while keep < min(len(self.view), len(self.committed) - 1) and \
                self.view[keep] == self.committed[keep]:
            keep += 1
        return draft_pb2.ProposeRequest(session_id=self.session, keep_len=keep,
                                        keep_digest=digest.digest(self.committed[:keep]),
                                        new_tokens=self.committed[keep:], num_tokens=3)

    def update(self, tokens: list[int], bonus: int) -> None:
        self.view = self.committed + tokens[:-1]
        self.committed = self.committed + tokens + [bonus]


def test_interleaved_propose_sessions_on_one_openvino_draft(ov_servers):
    """Three sessions' rounds interleaved give the same drafts as each run alone."""
    from specdec.v1 import draft_pb2_grpc

    stub = draft_pb2_grpc.DraftServiceStub(grpc.insecure_channel(ov_servers["ov_draft"][1]))
    prompts = [[1, 2, 3], [400, 500, 600, 700], [9]]

    def play(drivers, order):
        seen: dict[str, list[list[int]]] = {d.session: [] for d in drivers}
        for i in order:
            d = drivers[i]
            tokens = list(stub.Propose(d.request()).tokens)
            seen[d.session].append(tokens)
            d.update(tokens, bonus=len(seen[d.session]))
        return [seen[d.session] for d in drivers]

    rounds = 4
    alone = [play([Driver(f"alone-{i}", p)], [0] * rounds)[0] for i, p in enumerate(prompts)]
    mixed = play([Driver(f"mixed-{i}", p) for i, p in enumerate(prompts)],
                 [0, 1, 2] * rounds)
    assert mixed == alone
