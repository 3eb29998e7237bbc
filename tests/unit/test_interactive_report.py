"""`specdec bench --interactive`'s figures from recorded requests (pure logic)."""

from __future__ import annotations

import pytest

from specdec_tools.bench import interactive_report as report
from specdec_tools.bench.interactive import order


def row(kind, prompt, variant, tok_s, drafted=10, tokens=(1, 2, 3), repeat=0, reason=""):
    k = None if variant == "server" else int(variant[2:])
    return {"kind": kind, "prompt": prompt, "repeat": repeat, "variant": variant, "k": k,
            "tokens": 3, "seconds": 3 / tok_s, "tok_s": tok_s, "ttft": 0.1, "rounds": 3,
            "drafted": 0 if variant == "K=0" else drafted, "accepted": 0 if variant == "K=0"
            else drafted // 2, "mean_k": k or 0.0, "drafts_per_round": 1.0,
            "reason": reason, "error": None, "token_ids": list(tokens)}


def test_speedups_best_fixed_k_and_the_servers_ratio():
    rows = []
    for p, base in (("a", 10.0), ("b", 20.0)):
        rows += [row("chat", p, "K=0", base), row("chat", p, "server", base * 1.5),
                 row("chat", p, "K=2", base * 1.4), row("chat", p, "K=4", base * 1.6)]
    s = report.summarise(rows)["chat"]
    assert s["variants"]["server"]["speedup"] == pytest.approx(1.5)
    assert s["best_fixed"] == "K=4"
    assert s["server_over_best"] == pytest.approx(1.5 / 1.6)
    assert s["idle_server"] == []
    assert list(s["variants"]) == ["K=0", "server", "K=2", "K=4"]


def test_a_server_request_that_drafted_nothing_where_a_fixed_k_gained_is_flagged():
    rows = [row("chat", "a", "K=0", 10.0), row("chat", "a", "server", 10.0, drafted=0,
                                               reason="acceptance 0.1 below break-even 0.3"),
            row("chat", "a", "K=3", 12.5),
            row("chat", "b", "K=0", 10.0), row("chat", "b", "server", 10.0, drafted=0),
            row("chat", "b", "K=3", 11.0)]  # gains less than 1.2x: not flagged
    s = report.summarise(rows)["chat"]
    assert s["idle_server"] == ["a#0"]
    assert s["reasons"] == ["acceptance 0.1 below break-even 0.3"]


def test_outputs_that_differ_from_target_only_are_problems():
    rows = [row("chat", "a", "K=0", 10.0), row("chat", "a", "K=2", 12.0, tokens=(1, 2, 4))]
    assert report.mismatches(rows) == ["chat/a#0 K=2"]
    assert report.problems(rows, []) == ["greedy output differs from target-only: chat/a#0 K=2"]


def test_the_variants_order_rotates_from_prompt_to_prompt():
    v = [0, None, 1, 2]
    assert [order(v, i)[0] for i in range(5)] == [0, None, 1, 2, 0]
    assert sorted(order(v, 3), key=str) == sorted(v, key=str)


def test_the_penalised_kind_sends_the_general_prompts_with_penalties():
    from specdec import wire
    from specdec_tools.bench.interactive import PENALISED, PENALTIES, kind_prompts
    from specdec_tools.bench.interactive_prompts import SETS
    from specdec_tools.bench.load_report import Load
    from specdec_tools.bench.system import _request

    prompts = kind_prompts("held-out", ["code", PENALISED])
    assert list(prompts) == ["code", PENALISED]
    assert prompts[PENALISED] == SETS["held-out"]["general"]
    sampling = Load(1, 8, ("hi",), **PENALTIES).sampling(0, 0)
    assert sampling.penalised and sampling.greedy
    req = _request("hi", 8, 0, sampling)  # the penalties reach the wire
    back = wire.sampling_from_proto(req.sampling)
    assert (back.presence_penalty, back.frequency_penalty) == (0.5, 0.5)
    assert not Load(1, 8, ("hi",)).sampling(0, 0).penalised
    with pytest.raises(SystemExit, match="unknown chat"):
        kind_prompts("held-out", ["chat"])


def test_the_load_table_sets_the_server_beside_each_peers_plain_pipeline():
    from specdec_tools.bench.load_report import LoadRow

    def load_row(scenario, tps, baseline=None, api=""):
        return LoadRow(scenario, 4, baseline, 8, 512, 15.0, tps, None, None, None, None,
                       None, None, None, api=api)

    rows = [load_row("target-only", 30.0, api="grpc"),
            load_row("server's K", 33.0, baseline="target-only", api="grpc"),
            load_row(report.GENAI_PLAIN, 30.0),
            load_row(report.LLAMACPP_PLAIN, 22.0),
            load_row(report.LLAMACPP_PLAIN.replace("plain", "speculative (-md) K=4"), 40.0,
                     baseline=report.LLAMACPP_PLAIN)]
    (r,) = report.load_table(rows)
    assert r["over_genai"] == pytest.approx(1.1)
    assert r["llamacpp_plain_tps"] == 22.0 and r["over_llamacpp"] == pytest.approx(1.5)
    md = report.markdown({}, [r], {"command": "x", "date": "d", "machine": "m",
                                   "prompt_set": "held-out", "max_new_tokens": 64,
                                   "repeats": 1})
    assert "| 22.0 | 1.50x |" in md


def test_the_target_services_own_pass_is_a_median_and_a_column_where_it_was_read():
    rows = []
    for p, ms in (("a", 100.0), ("b", 120.0), ("c", 140.0)):
        base, spec = row("chat", p, "K=0", 10.0), row("chat", p, "K=2", 12.0)
        base["target_pass_ms"], spec["target_pass_ms"] = ms, ms * 1.5
        rows += [base, spec, row("chat", p, "server", 11.0)]  # the server's: not read
    v = report.summarise(rows)["chat"]["variants"]
    assert v["K=0"]["target_pass_ms"] == pytest.approx(120.0)
    assert v["K=2"]["target_pass_ms"] == pytest.approx(180.0)
    assert v["server"]["target_pass_ms"] is None
    md = report.markdown(report.summarise(rows), [], {
        "command": "c", "date": "d", "machine": "m", "prompt_set": "s",
        "max_new_tokens": 8, "repeats": 1})
    assert "| target pass, ms |" in md
    assert "| K=2 | 1.20x | 12.0 | 0.50 | 2.00 | 1.00 | 180.0 | 0 of 3 |" in md
    assert "| server | 1.10x | 11.0 | 0.50 | 0.00 | 1.00 | - | 0 of 3 |" in md
