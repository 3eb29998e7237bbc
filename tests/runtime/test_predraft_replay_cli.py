"""`specdec replay-predraft` end to end on the tiny models, loaded as the served pair's
services would load them (real OpenVINO backends, passes timed here)."""

from __future__ import annotations

import json

from specdec.cli import main


def test_replays_every_scheme_for_every_k_and_writes_its_results(tmp_path, capsys):
    assert main(["replay-predraft", "--pair", "smollm2", "--target-model", "tiny-random",
                 "--draft-model", "tiny-random-draft", "--kinds", "general", "--ks", "1,2",
                 "--branches", "1", "--max-new-tokens", "10", "--passes", "2",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "predraft_replay.json").read_text())
    assert set(data["meta"]["verify_ms"]) == {"1", "2", "3"}  # widths 1..K+1
    assert set(data["meta"]["draft_ms"]) == {"1", "4"}  # 1 + B + K x B = 4 sessions
    block = data["kinds"]["general"]
    assert block["prompts"] == 8 and block["ks"] == [1, 2]
    assert [(r["branches"], r["fetch"]) for r in block["rows"]] == \
        [(0, None), (1, None), (0, 1), (0, 2)]
    assert all(len(r["speedups"]) == 2 and all(x > 0 for x in r["speedups"])
               for r in block["rows"])
    assert 0 <= block["agreement"]["top1"] <= 1
    md = (tmp_path / "predraft_replay.md").read_text()
    assert "today: one pre-draft, fetch K" in md and "| K=1 | K=2 |" in md


def test_bad_arguments_are_refused_before_any_model_loads(tmp_path, capsys):
    for bad in (["--ks", "0"], ["--kinds", "poetry"], ["--branches", "-1"],
                ["--max-new-tokens", "1"]):
        assert main(["replay-predraft", *bad, "--out", str(tmp_path)]) == 2
    assert "--kinds among" in capsys.readouterr().err
