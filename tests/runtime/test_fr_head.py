"""FR-Spec draft heads on the tiny models: the frequency ranking (specdec.runtime.fr_vocab),
the sliced IR (specdec.runtime.fr_head) through both OpenVINO backends, a draft that
never proposes outside its head, sampling over -inf rows, the flags' errors, and the
bench's acceptance arithmetic (specdec_tools.bench.draft_head)."""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter

import pytest
import torch

from specdec import digest, paths
from specdec.runtime.fr_vocab import Recipe, generate, load, rank, ranked_vocab
from specdec.runtime.models import TINY_DRAFT, TINY_VOCAB, tiny_recipe_hash
from specdec.runtime.openvino_backend import OpenVINOBackend
from specdec.runtime.openvino_export import MARKER, export, export_tiny, resolve_ir
from specdec.runtime.openvino_paged import PagedOpenVINOBackend
from specdec.sampling import SamplingParams, process_logits, truncate
from specdec.verify import argmax

N = 64  # of the tiny models' 768 tokens
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """SPECDEC_HOME in a fresh folder (tiny exports by name resolve there)."""
    old = os.environ.get(paths.SPECDEC_HOME)
    path = tmp_path_factory.mktemp("fr-home")
    os.environ[paths.SPECDEC_HOME] = str(path)
    yield path
    if old is None:
        os.environ.pop(paths.SPECDEC_HOME)
    else:
        os.environ[paths.SPECDEC_HOME] = old


@pytest.fixture(scope="module")
def irs(home):
    """(full fp32 IR, sliced fp32 IR, the draft's HF folder) of tiny-random-draft."""
    sliced = export_tiny(TINY_DRAFT, "fp32", home, head_vocab=N)
    hf = paths.model_dir(f"{TINY_DRAFT}-{tiny_recipe_hash()}", home)
    return paths.ir_dir_for(hf, "fp32"), sliced, hf


@pytest.fixture(scope="module")
def head(irs):
    return json.loads((irs[1] / "head_ids.json").read_text())["ids"]


def test_rank_puts_first_then_generated_then_prompt_counts_then_ids():
    generated = Counter({5: 3, 7: 3, 9: 1})
    prompt = Counter({8: 2, 1: 1, 9: 5})
    assert rank(generated, prompt, 10, first=[2]) == [2, 5, 7, 9, 8, 1, 0, 3, 4, 6]
    assert rank(Counter(), Counter(), 4) == [0, 1, 2, 3]


def test_ranking_is_deterministic_cached_and_tied_to_its_recipe(irs):
    _, _, hf = irs
    cached = load(hf)
    assert cached is not None  # the export ranked the model and cached it
    assert sorted(cached.ids) == list(range(TINY_VOCAB)) and cached.ids[0] == 2  # eos first
    def fp32_ir():
        return export(hf, "fp32")

    again = ranked_vocab(hf, fp32_ir, force=True, progress=False)
    assert again.ids == cached.ids and again.counts == cached.counts
    said: list[str] = []
    assert ranked_vocab(hf, fp32_ir, say=said.append).ids == cached.ids
    assert any("cached" in s for s in said)
    assert load(hf, Recipe(seed=1)) is None  # another recipe is a cache miss
    # a smaller recipe, twice from scratch: same text, same counts
    small = Recipe(max_new_tokens=8, prompts=Recipe().prompts[:5], batch=2)
    texts = [generate(_target(irs[0]), [[1, 2, 3], [9, 8], [7]], small, {2}, progress=False)
             for _ in range(2)]
    assert texts[0] == texts[1] and len(texts[0]) == 3 * len(small.temperatures)


def _target(ir):
    return PagedOpenVINOBackend(ir, "CPU", threads=1)


def test_the_sliced_export_keeps_the_top_ranked_rows_and_is_cached(irs, head, home):
    _, sliced, hf = irs
    assert sliced.name.endswith(f"-ov-fp32-head{N}")
    assert head == sorted(load(hf).ids[:N]) and len(head) == N  # ascending ids
    marker = json.loads((sliced / MARKER).read_text())
    assert marker["head_vocab"] == N
    config = json.loads((sliced / "config.json").read_text())
    assert config["vocab_size"] == TINY_VOCAB  # the embedding's, as the coordinator checks
    assert export_tiny(TINY_DRAFT, "fp32", home, head_vocab=N) == sliced  # cache hit
    assert resolve_ir(TINY_DRAFT, "fp32", (), N)[0] == sliced


@pytest.mark.parametrize("kind", [OpenVINOBackend, PagedOpenVINOBackend],
                         ids=["stateful", "paged"])
def test_sliced_logits_equal_the_full_ones_on_the_head_and_are_minus_inf_elsewhere(
        irs, head, kind):
    full, sliced = (kind(ir, "CPU", threads=1) for ir in irs[:2])
    assert (sliced.vocab_size, sliced.head_vocab, full.head_vocab) == (TINY_VOCAB, N, 0)
    outside = torch.ones(TINY_VOCAB, dtype=torch.bool)
    outside[head] = False

    def check(a, b):
        assert b.shape == a.shape == (b.shape[0], TINY_VOCAB)
        torch.testing.assert_close(b[:, head], a[:, head], rtol=1e-4, atol=1e-4)
        assert torch.isneginf(b[:, outside]).all() and torch.isfinite(b[:, head]).all()

    check(full.forward(full.new_cache(), PROMPT, 4), sliced.forward(sliced.new_cache(), PROMPT, 4))
    if kind is PagedOpenVINOBackend:
        assert sliced._gathers  # the LM head is still one MatMul after the transformation
        items = [(PROMPT, 1), ([7, 7, 7], 2), ([400], 1)]
        got = [b.forward_batch([(b.new_cache(), t, k) for t, k in items]) for b in (full, sliced)]
        for a, b in zip(*got, strict=True):
            check(a, b)


def test_sampling_over_minus_inf_rows_gives_zero_outside_the_head():
    logits = torch.full((TINY_VOCAB,), -math.inf)
    inside = torch.tensor([3, 40, 41, 500, 767])
    logits[inside] = torch.tensor([0.5, 2.0, 1.0, -3.0, 1.9])
    assert argmax(logits[None]) == [40]
    for params in (SamplingParams(), SamplingParams(temperature=0.7),
                   SamplingParams(temperature=1e-6), SamplingParams(temperature=1.0, top_k=3),
                   SamplingParams(temperature=1.0, top_k=100),
                   SamplingParams(temperature=1.0, top_p=0.9)):
        probs = process_logits(logits, params)
        assert torch.isfinite(probs).all() and abs(float(probs.sum()) - 1) < 1e-5, params
        mask = torch.ones(TINY_VOCAB, dtype=torch.bool)
        mask[inside] = False
        assert (probs[mask] == 0).all(), params
        ids, q = truncate(probs, 32, 0.99)
        assert set(ids.tolist()) <= set(inside.tolist()) and abs(float(q.sum()) - 1) < 1e-5


def test_a_sliced_draft_never_proposes_outside_its_head(irs, head):
    from draft_service.__main__ import create as create_draft
    from draft_service.config import DraftConfig
    from draft_service.engine import ProposeArgs

    def proposals(cfg):
        _, _, engine = create_draft(cfg)
        drafted: set[int] = set()
        for i, prompt in enumerate([PROMPT, [700, 12, 99], [42], [5, 600, 601, 602]]):
            for params in (SamplingParams(), SamplingParams(temperature=1.0, seed=i)):
                sid = f"fr-{i}-{params.temperature}"
                r = engine.propose(ProposeArgs(session_id=sid, keep_len=0,
                                               keep_digest=digest.digest([]),
                                               new_tokens=prompt, num_tokens=8,
                                               sampling=params))
                drafted.update(r.tokens)
                for q in r.dists:
                    drafted.update(q.token_ids.tolist())
                engine.release(sid)
        return engine, drafted

    cfg = dict(model=TINY_DRAFT, backend="openvino", port=0, warmup=False)
    engine, drafted = proposals(DraftConfig(weights="int8", head_vocab=N, **cfg))
    assert engine.model.vocab_size == TINY_VOCAB and engine.model.backend.head_vocab == N
    assert engine.model.backend._gathers  # the int8 sliced IR through the paged transform
    assert drafted and drafted <= set(head)
    _, whole = proposals(DraftConfig(weights="fp32", **cfg))
    assert whole - set(head)  # the full head does propose those: the check bites


def test_head_vocab_flag_errors_are_clear(irs, home, caplog):
    from draft_service.__main__ import create as create_draft
    from draft_service.__main__ import main as draft_main
    from draft_service.config import DraftConfig, from_args, parser
    from specdec.cli import parser as specdec_parser

    assert from_args(["--model", TINY_DRAFT]).head_vocab == 0
    assert from_args(["--model", TINY_DRAFT, "--head-vocab", "4096"]).head_vocab == 4096
    for bad in ("-1", "many"):
        with pytest.raises(SystemExit):
            from_args(["--model", TINY_DRAFT, "--head-vocab", bad])
    text = " ".join(parser().format_help().split())
    assert "--head-vocab N" in text and "specdec prepare --openvino" in text
    args = specdec_parser().parse_args(["prepare", "--head-vocab", "4096", "--head-vocab", "2048"])
    assert args.head_vocab == [4096, 2048]
    with pytest.raises(ValueError, match="needs --backend openvino"):
        create_draft(DraftConfig(model=TINY_DRAFT, head_vocab=N, port=0, warmup=False))
    with pytest.raises(ValueError, match=f"between 1 and {TINY_VOCAB - 1}"):
        resolve_ir(TINY_DRAFT, "fp32", (), TINY_VOCAB)
    with pytest.raises(ValueError, match="--head-vocab needs the Hugging Face folder"):
        resolve_ir(str(irs[0]), "fp32", (), N)
    # the prepared model, never exported with that head here: which command makes it
    with pytest.raises(FileNotFoundError,
                       match="specdec prepare --openvino --weights int8 --head-vocab 1234"):
        resolve_ir(paths.SMOLLM2, "int8", (), 1234)
    caplog.set_level(logging.ERROR)
    assert draft_main(["--model", paths.SMOLLM2, "--backend", "openvino", "--weights", "int8",
                       "--head-vocab", "1234", "--port", "0", "--no-warmup"]) == 2
    assert "specdec prepare --openvino --weights int8 --head-vocab 1234" in caplog.text


def test_bench_acceptance_of_a_sliced_copy_is_its_coverage_and_head_mass(irs, head):
    """Drafting for itself, a model's sliced copy accepts greedily exactly where the
    target's token is in the head, and at temperature 1 exactly the target's mass on the
    head (min(p, q) = p on the head, where q = p / p(head) >= p)."""
    from specdec_tools.bench.draft_head import acceptance, target_rows, time_passes

    full, sliced = (_target(ir) for ir in irs[:2])
    prompts = [PROMPT, [700, 12, 99], [42]]
    texts = generate(full, prompts, Recipe(max_new_tokens=12, temperatures=(0.0,)),
                     set(), progress=False)
    p_rows = target_rows(full, prompts, texts)
    same = acceptance(full, prompts, texts, p_rows)
    assert same["greedy_acceptance"] == 1.0 and abs(same["sampled_acceptance"] - 1) < 1e-5
    cut = acceptance(sliced, prompts, texts, p_rows)
    inside = [x in set(head) for t in texts for x in t]
    assert cut["head_coverage"] == pytest.approx(sum(inside) / len(inside))
    assert cut["greedy_acceptance"] == pytest.approx(cut["head_coverage"])
    mass = torch.cat([p[:, head].sum(-1) for p in p_rows]).mean()
    assert cut["sampled_acceptance"] == pytest.approx(float(mass), abs=1e-5)
    ms = time_passes({0: full, N: sliced}, [1, 2], prompts, passes=2, repeats=1,
                     progress=False)
    assert set(ms) == {(0, 1), (0, 2), (N, 1), (N, 2)} and min(ms.values()) > 0


def test_greedy_output_with_a_sliced_draft_equals_target_only(irs, target_client):
    """Lossless: the target verifies over the whole vocabulary, whatever the draft's head."""
    import grpc

    from coordinator.loop import SpeculativeLoop
    from coordinator.loop.policy import LoopPolicy
    from coordinator.remote.clients import DraftClient
    from draft_service.__main__ import create as create_draft
    from draft_service.config import DraftConfig

    server, port, _ = create_draft(DraftConfig(model=TINY_DRAFT, backend="openvino",
                                               weights="int8", head_vocab=N, port=0,
                                               warmup=False))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            loop = SpeculativeLoop(DraftClient(channel), target_client,
                                   LoopPolicy(pipeline=False))
            drafted = 0
            for prompt in (PROMPT, [700, 12, 99], [42]):
                baseline = loop.generate(prompt, 24, SamplingParams(), num_draft_tokens=0)
                result = loop.generate(prompt, 24, SamplingParams(), num_draft_tokens=4)
                assert result.token_ids == baseline.token_ids, prompt
                drafted += result.stats.drafted_tokens
            assert drafted > 0
    finally:
        server.stop(0)
