"""A self-speculative draft over the real servers: the target's own model with a layer
skipped (draft --skip-layers), on torch and on OpenVINO (an IR exported for the set),
gives target-only greedy output, and says its skip set in ModelInfo."""

from __future__ import annotations

import grpc
import pytest

from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from coordinator.remote.clients import DraftClient
from draft_service.__main__ import create as create_draft
from draft_service.config import DraftConfig, from_args
from specdec.sampling import SamplingParams
from specdec.v1 import common_pb2

PROMPTS = [[1, 2, 3, 4, 5], [700, 12, 99], [42]]
GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=[("torch", (0,)), ("torch", (1,)),
                                        ("openvino", (1,))],
                ids=["torch-skip0", "torch-skip1", "openvino-skip1"])
def skip_draft(request, tmp_home):
    backend, skip = request.param
    server, port, engine = create_draft(DraftConfig(model="tiny-random", backend=backend,
                                                    skip_layers=skip, port=0))
    server.start()
    yield DraftClient(grpc.insecure_channel(f"127.0.0.1:{port}")), skip
    server.stop(0)


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_a_layer_skip_draft_equals_target_only(skip_draft, target_client, k):
    draft, skip = skip_draft
    loop = SpeculativeLoop(draft, target_client, LoopPolicy(pipeline=False))
    accepted = drafted = 0
    for prompt in PROMPTS:
        baseline = loop.generate(prompt, 32, GREEDY, num_draft_tokens=0)
        result = loop.generate(prompt, 32, GREEDY, num_draft_tokens=k)
        assert result.token_ids == baseline.token_ids, (prompt, k)
        accepted += result.stats.accepted_tokens
        drafted += result.stats.drafted_tokens
    if skip == (1,):
        assert 0 < accepted < drafted  # the half-model drafts, and is often wrong
    else:
        # Without its first layer the tiny target never agrees with itself: only the
        # rejection path runs, and the output is still the target's.
        assert drafted > 0


def test_the_skip_set_is_in_model_info(skip_draft):
    draft, skip = skip_draft
    info = draft.stub.Info(common_pb2.InfoRequest())
    assert tuple(info.skip_layers) == skip and info.model_id == "tiny-random"


def test_a_set_the_model_cannot_skip_stops_the_service_with_a_reason():
    with pytest.raises(ValueError, match=r"has 2 decoder layers \(0-1\); 2 is not"):
        create_draft(DraftConfig(model="tiny-random", skip_layers=(2,), port=0))
    with pytest.raises(ValueError, match="keep at least one"):
        create_draft(DraftConfig(model="tiny-random", skip_layers=(0, 1), port=0))
    with pytest.raises(SystemExit):
        from_args(["--model", "tiny-random", "--skip-layers", "1,x"])


PROMPT_SAMPLED = [414, 274, 1, 23]  # where the half-model's top 6 overlap the target's most
TRIALS = 1500


def sampled_check(cfg: DraftConfig, target_client, target_server, max_new_tokens: int,
                  k: int):
    """Run TRIALS seeded generations through `cfg`'s draft; returns (chi-square p of the
    first two tokens' law against the target's, accepted, drafted, engine)."""
    from collections import Counter

    from tests.service.test_sampled_distribution import (
        chi_square_p_value,
        run_seeds,
        target_joint,
    )

    server, port, engine = create_draft(cfg)
    server.start()
    try:
        loop = SpeculativeLoop(DraftClient(grpc.insecure_channel(f"127.0.0.1:{port}")),
                               target_client, LoopPolicy(pipeline=False))
        params = SamplingParams(temperature=1.0, top_k=6)
        expected = target_joint(target_server[1].model.backend, params,
                                prompt=PROMPT_SAMPLED)
        results = run_seeds(lambda seed: loop.generate(
            PROMPT_SAMPLED, max_new_tokens, SamplingParams(1.0, 6, 1.0, seed), k), TRIALS)
        counts = Counter(tuple(r.token_ids[:2]) for r in results)
        accepted = sum(r.stats.accepted_tokens for r in results)
        drafted = sum(r.stats.drafted_tokens for r in results)
    finally:
        server.stop(0)
    p_value = chi_square_p_value(counts, expected, TRIALS)
    print(f"chi-square p = {p_value:.3f}, acceptance = {accepted / max(drafted, 1):.2f}")
    assert p_value > 1e-3, (p_value, counts.most_common(8))
    return p_value, accepted, drafted, engine


@pytest.mark.slow
@pytest.mark.long  # the same math as skipping on the fly's, which `make test` checks
def test_sampled_output_with_a_layer_skip_draft_follows_the_target(tmp_home, target_client,
                                                                    target_server):
    """The chi-square test of the two-token joint law (as for the model draft), with the
    target's own model minus its second layer as the draft."""
    _, accepted, drafted, _ = sampled_check(
        DraftConfig(model="tiny-random", skip_layers=(1,), port=0), target_client,
        target_server, 2, 2)
    assert 0 < accepted < drafted


@pytest.fixture(scope="module")
def on_the_fly_draft(tmp_home):
    """The tiny target as a draft that chooses per round whether to skip layer 1."""
    server, port, engine = create_draft(DraftConfig(model="tiny-random", port=0,
                                                    skip_on_the_fly=(1,), skip_window=2))
    server.start()
    yield DraftClient(grpc.insecure_channel(f"127.0.0.1:{port}")), engine
    server.stop(0)


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_skipping_on_the_fly_equals_target_only(on_the_fly_draft, target_client,
                                                            k):
    draft, engine = on_the_fly_draft
    loop = SpeculativeLoop(draft, target_client, LoopPolicy(pipeline=False))
    for prompt in PROMPTS * 2:
        baseline = loop.generate(prompt, 32, GREEDY, num_draft_tokens=0)
        result = loop.generate(prompt, 32, GREEDY, num_draft_tokens=k)
        assert result.token_ids == baseline.token_ids, (prompt, k)
    # It measured both depths and moved between them, one step per decision.
    assert set(engine.climber.rates) == {0, 1}
    assert {0, 1} <= set(engine.climber.history)
    assert all(abs(a - b) <= 1 for a, b in zip(engine.climber.history,
                                                engine.climber.history[1:], strict=False))


def test_skipping_on_the_fly_needs_the_torch_backend_and_no_fixed_set():
    with pytest.raises(ValueError, match="needs --backend torch and no --skip-layers"):
        create_draft(DraftConfig(model="tiny-random", backend="openvino", port=0,
                                 skip_on_the_fly=(1,)))
    with pytest.raises(ValueError, match="needs --backend torch and no --skip-layers"):
        create_draft(DraftConfig(model="tiny-random", port=0, skip_layers=(0,),
                                 skip_on_the_fly=(1,)))
    with pytest.raises(ValueError, match=r"has 2 decoder layers \(0-1\); 5 is not"):
        create_draft(DraftConfig(model="tiny-random", port=0, skip_on_the_fly=(5,)))


@pytest.mark.slow
def test_sampled_output_skipping_on_the_fly_follows_the_target(tmp_home, target_client,
                                                               target_server):
    """The chi-square test with a draft that switches between the whole model and the
    model without layer 1 as often as it can (K=1 over 4 tokens: every generation
    proposes at least twice, so the policy hears of its first round): its q is whichever
    it sampled from. The law checked is that of the first two tokens."""
    *_, engine = sampled_check(
        DraftConfig(model="tiny-random", port=0, skip_on_the_fly=(1,), skip_window=1),
        target_client, target_server, 4, 1)
    assert {0, 1} <= set(engine.climber.history)
