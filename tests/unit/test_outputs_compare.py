"""specdec_tools.outputs.compare: two recordings of every loop variant's output."""

from __future__ import annotations

from specdec_tools.outputs import compare, main

REF = {"chat": [1, 2, 3], "code": [4, 5]}


def test_the_same_outputs_pass():
    a = {"target-only greedy": REF, "pipelined K=4 greedy": REF, "x sampled": {"chat": [9]}}
    assert compare(a, dict(a))[-1] == "all the same"


def test_a_changed_variant_or_a_greedy_one_off_target_only_fails():
    a = {"target-only greedy": REF, "pipelined K=4 greedy": REF, "x sampled": {"chat": [9]}}
    changed = dict(a, **{"x sampled": {"chat": [8]}})
    lines = compare(a, changed)
    assert lines[-1] == "FAIL" and any("x sampled" in x and "DIFFERENT" in x for x in lines)
    off = {"target-only greedy": REF, "pipelined K=4 greedy": {"chat": [1, 2, 7], "code": [4, 5]}}
    lines = compare(off, off)
    assert lines[-1] == "FAIL" and any("NOT target-only" in x for x in lines)


def test_the_command_exits_1_on_a_difference(tmp_path):
    import json

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"target-only greedy": REF}))
    b.write_text(json.dumps({"target-only greedy": {"chat": [1], "code": [4, 5]}}))
    assert main(["compare", str(a), str(a)]) == 0
    assert main(["compare", str(a), str(b)]) == 1
