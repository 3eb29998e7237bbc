"""`specdec eval`'s pure parts: the modes and their requests, the log-likelihood against a
position-by-position computation on the tiny model, the figures, tables and JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specdec.sampling import SamplingParams
from specdec.v1 import common_pb2, generate_pb2
from specdec_tools.bench import harness, quality_report, quality_score
from specdec_tools.bench.quality_eval import (
    COMPARISONS,
    MODE_KEYS,
    ContrastiveSettings,
    EvalSample,
    EvalScenario,
    modes,
    request,
)


def by_key(k=4, temperature=1.0):
    return {m.key: m for m in modes(k, temperature)}


def test_the_modes_the_issue_asks_for():
    m = by_key()
    assert list(m) == list(MODE_KEYS)
    assert (m["greedy"].k, m["greedy"].temperature, m["greedy"].contrastive) == (0, 0.0, False)
    assert (m["sampled"].k, m["sampled"].temperature) == (0, 1.0)
    assert (m["spec-sampled"].k, m["spec-sampled"].contrastive) == (4, False)
    for key, k, greedy in [("cd-greedy", 0, True), ("cd-greedy-spec", 4, True),
                           ("cd-sampled", 0, False), ("cd-sampled-spec", 4, False)]:
        assert (m[key].contrastive, m[key].k, m[key].greedy) == (True, k, greedy)
    assert len({x.name for x in m.values()}) == len(m)  # names key the harness
    assert m["cd-greedy-spec"].name == "contrastive greedy, speculative K=4"
    assert COMPARISONS[0] == ("cd-greedy-spec", "cd-greedy")
    assert all(a in MODE_KEYS and b in MODE_KEYS for a, b in COMPARISONS)
    assert [x.key for x in modes(keys=["cd-greedy", "greedy"])] == ["greedy", "cd-greedy"]
    with pytest.raises(ValueError, match="unknown mode"):
        modes(keys=["beam"])


def test_requests_carry_the_decoding_fields_only_for_contrastive_modes():
    m = by_key(k=3, temperature=0.7)
    s = SamplingParams(0.7, seed=5)
    plain = request("Once", 16, s, m["spec-sampled"])
    assert plain.prompt == "Once" and not plain.messages and plain.num_draft_tokens == 3
    assert plain.decoding == generate_pb2.DECODING_SPECULATIVE
    assert not plain.HasField("contrastive")
    assert plain.sampling.temperature == pytest.approx(0.7) and plain.sampling.seed == 5
    cd = request("Once", 16, s, m["cd-greedy"], ContrastiveSettings(beta=1.0,
                                                                    formulation="li"))
    assert cd.decoding == generate_pb2.DECODING_CONTRASTIVE and cd.num_draft_tokens == 0
    assert cd.contrastive.formulation == common_pb2.CONTRASTIVE_FORMULATION_LI
    assert cd.contrastive.HasField("beta") and cd.contrastive.beta == 1.0
    assert not cd.contrastive.HasField("alpha")  # unset: the server's default
    assert not request("Once", 1, s, None).HasField("num_draft_tokens")


class FakeService:
    """Streams one scripted answer; records the requests (no loop, no wire)."""

    class _Loop:
        draft = target = None

    def __init__(self, head=3.5):
        self.loop, self.requests, self.head = self._Loop(), [], head

    def stream(self, req):
        self.requests.append(req)
        yield generate_pb2.GenerateChunk(text="a b", token_ids=[5, 6])
        last = generate_pb2.GenerateChunk(text=" c", token_ids=[7], finish_reason="length")
        last.stats.rounds, last.stats.mean_head_size = 2, self.head
        yield last


def test_the_scenario_sends_its_mode_and_keeps_the_head_size():
    service = FakeService()
    m = by_key()
    sample = EvalScenario(service, m["cd-sampled-spec"]).run("Hi", 8, SamplingParams(1.0, 0, 0, 2))
    assert isinstance(sample, EvalSample) and sample.mode == "cd-sampled-spec"
    assert (sample.text, sample.token_ids, sample.mean_head_size) == ("a b c", [5, 6, 7], 3.5)
    assert sample.scenario == m["cd-sampled-spec"].name
    assert service.requests[0].decoding == generate_pb2.DECODING_CONTRASTIVE
    assert EvalScenario(service, m["greedy"]).run("Hi", 8, SamplingParams()).mean_head_size \
        is None


@pytest.fixture(scope="module")
def tiny():
    from specdec.runtime.models import build_tiny

    return build_tiny("tiny-random").model


def test_loglik_equals_the_position_by_position_sum(tiny):
    prompt, gen = [3, 17, 40], [99, 5, 250, 5]
    by_hand = []
    for i, tok in enumerate(gen):
        with torch.no_grad():
            logits = tiny(torch.tensor([prompt + gen[:i]])).logits[0, -1].double()
        z = torch.logsumexp(logits, -1)
        by_hand.append(float(logits[tok] - z))
    got = quality_score.mean_loglik(tiny, prompt, gen)
    assert got == pytest.approx(sum(by_hand) / len(gen), abs=1e-5)
    assert got < 0 and quality_score.mean_loglik(tiny, prompt, []) is None
    with pytest.raises(ValueError):
        quality_score.mean_loglik(tiny, [], gen)


def test_cached_scores_each_text_once():
    calls = []
    f = quality_score.cached(lambda p, ids: calls.append((p, ids)) or float(len(ids)))
    assert f("a", [1, 2]) == f("a", [1, 2]) == 2.0 and f("b", [1, 2]) == 2.0
    assert len(calls) == 2


def s(mode, prompt, repeat, text, ids, seconds=1.0, head=None, drafted=0, accepted=0):
    m = by_key()[mode]
    out = EvalSample(m.name, prompt, len(ids), seconds, token_ids=list(ids), text=text,
                     drafted=drafted, accepted=accepted, mode=mode, mean_head_size=head)
    out.repeat, out.temperature = repeat, m.temperature
    return out


def synthetic():
    return [
        # greedy: the same text at both seeds; counted once
        s("cd-greedy", "P", 0, "a b a b", [1, 2, 1, 2], 2.0, head=2.0),
        s("cd-greedy", "P", 1, "a b a b", [1, 2, 1, 2], 2.0, head=4.0),
        s("cd-greedy-spec", "P", 0, "a b a b", [1, 2, 1, 2], 1.0, head=2.0, drafted=8,
          accepted=6),
        s("cd-greedy-spec", "P", 1, "a b a c", [1, 2, 1, 3], 0.5, head=4.0, drafted=8,
          accepted=2),
        s("sampled", "P", 0, "x y z", [7, 8, 9]),
        s("sampled", "P", 1, "x y w", [7, 8, 10]),
    ]


def test_summary_pools_dedupes_greedy_and_compares():
    chosen = modes()
    rows, comps = quality_score.summarise(synthetic(), chosen, lambda p, ids: -float(len(ids)))
    r = {x.mode: x for x in rows}
    assert list(r) == ["sampled", "cd-greedy", "cd-greedy-spec"]  # MODE_KEYS order
    g = r["cd-greedy"]
    assert (g.generations, g.texts_scored) == (2, 1)
    assert g.distinct_1 == 2 / 4 and g.distinct_2 == 2 / 3  # one copy of "a b a b"
    assert g.entropy_1 == pytest.approx(1.0) and g.seq_rep_4 == 0.0
    assert g.mean_head_size == 3.0 and g.deterministic is True and g.acceptance is None
    assert g.tokens_per_s == 2.0 and g.loglik == -4.0
    spec = r["cd-greedy-spec"]
    assert spec.deterministic is False and spec.acceptance == pytest.approx(8 / 16)
    sampled = r["sampled"]
    assert sampled.texts_scored == 2 and sampled.distinct_1 == 4 / 6
    assert sampled.entropy_1 == pytest.approx(-(2 * (1 / 3) * math.log2(1 / 3)
                                               + 2 * (1 / 6) * math.log2(1 / 6)))
    assert sampled.mean_head_size is None and sampled.deterministic is None
    (c,) = comps  # only the pair whose two modes ran
    assert (c.scenario, c.baseline, c.pairs, c.greedy) == ("cd-greedy-spec", "cd-greedy", 2,
                                                           True)
    # per (prompt, seed): (4/1)/(4/2) = 2 and (4/0.5)/(4/2) = 4; the median is 3
    assert c.ratio == pytest.approx(3.0) == harness.speedup(
        synthetic(), by_key()["cd-greedy-spec"].name, by_key()["cd-greedy"].name)
    assert c.identical is False and c.mismatches == ["'P' (seed index 1)"] and c.required


def test_markdown_json_and_plot(tmp_path):
    samples = synthetic()
    rows, comps = quality_score.summarise(samples, modes(), lambda p, ids: -1.0)
    meta = {"machine": "m", "target": "t", "draft": "d", "prompts": 1, "seeds": 2,
            "max_new_tokens": 4, "contrastive": "formulation obrien"}
    md = quality_report.markdown(rows, comps, meta, samples)
    assert "| contrastive greedy, plain | 2 | 1 | 4.0 | 2.0 (2.0-2.0) | 0.500 |" in md
    assert "| contrastive greedy, speculative K=4 | contrastive greedy, plain | 3.00x | 2 " \
           "| NO |" in md
    assert "3.00x the plain form's tok/s (target >= 1.3x: met), DIFFERENT ids on 2" in md
    assert "- target-only sampled T=1: x y z" in md
    header = md.splitlines()[4]
    assert header.count("|") == md.splitlines()[6].count("|")  # every cell filled
    path = tmp_path / "eval.json"
    quality_report.write_json(path, rows, comps, meta,
                              quality_report.sample_dicts(samples, lambda p, ids: -1.0))
    data = json.loads(path.read_text())
    assert set(data) == {"meta", "rows", "comparisons", "samples"}
    assert data["rows"][1]["mode"] == "cd-greedy" and data["comparisons"][0]["ratio"] == 3.0
    assert data["samples"][0]["loglik"] == -1.0 and data["samples"][0]["text"] == "a b a b"
    assert quality_report.plot(rows, tmp_path / "eval.png").stat().st_size > 1000


def test_only_two_forms_of_one_decoding_must_match():
    samples = synthetic() + [s("greedy", "P", r, "a b", [1, 2]) for r in (0, 1)]
    _, comps = quality_score.summarise(samples, modes())
    c = next(c for c in comps if c.baseline == "greedy")
    assert c.scenario == "cd-greedy" and c.identical is False and not c.required
    table = "\n".join(quality_report.comparisons_table(comps, {m.key: m.key for m in modes()}))
    assert "| cd-greedy | greedy | 1.00x | 2 | no (another distribution) |" in table
    assert "| cd-greedy-spec | cd-greedy | 3.00x | 2 | NO |" in table


def test_verdict_below_the_target_and_without_the_pair():
    slow = quality_score.Comparison("cd-greedy-spec", "cd-greedy", 1.1, 5, True, True)
    assert "1.10x" in quality_report.verdict([slow]) and "NOT met" in \
        quality_report.verdict([slow]) and "identical ids on 5" in quality_report.verdict([slow])
    assert quality_report.verdict([]) is None


def test_the_auto_modes_leave_k_to_the_server():
    from specdec.v1 import generate_pb2
    from specdec_tools.bench.quality_eval import modes, request

    m = {x.key: x for x in modes()}
    auto = request("Once", 16, SamplingParams(), m["cd-greedy-auto"])
    assert not auto.HasField("num_draft_tokens")
    assert auto.decoding == generate_pb2.DECODING_CONTRASTIVE
    assert m["cd-sampled-auto"].name == "contrastive sampled T=1, K chosen per round"


def test_rows_report_wire_bytes_per_generated_token():
    from specdec_tools.bench.quality_eval import EvalSample, modes
    from specdec_tools.bench.quality_score import mode_row

    mode = {m.key: m for m in modes()}["cd-greedy"]
    group = [EvalSample(mode.name, "p", 10, 1.0, wire_bytes=3000, mode=mode.key, text="a b"),
             EvalSample(mode.name, "p", 20, 1.0, wire_bytes=3000, mode=mode.key, text="a b",
                        repeat=1)]
    assert mode_row(mode, group, None).bytes_per_token == 200
