"""specdec bench-skip's rows: which drafts it measures and the command lines they get."""

from __future__ import annotations

from specdec_tools.skip_tune.bench import drafts, pair_for


def test_rows_are_the_whole_draft_the_tuned_set_and_random_sets_of_its_size():
    rows = drafts((12, 20), [(3,)], randoms=3, seed=0, layers=30)
    labels = [label for label, _ in rows]
    assert labels[:2] == ["int8 draft (default)", "int8 tuned (specdec tune-skip)"]
    assert labels[-1] == "int8 given" and rows[-1][1] == (3,)
    randoms = [s for label, s in rows if "random" in label]
    assert len(randoms) == 3 and len(set(randoms)) == 3
    assert all(len(s) == 2 and s != (12, 20) and max(s) < 30 for s in randoms)
    assert drafts(None, [], 3, 0, 30, "fp32") == [("fp32 draft", ())]


def test_pairs_carry_the_set_or_the_on_the_fly_order():
    ov = pair_for("x", (3, 5), "smollm2-135m", "fp32")
    assert ov.draft.backend == "openvino" and ov.draft.weights == "fp32"
    assert ov.draft.args()[-2:] == ["--skip-layers", "3,5"]
    assert ov.target.backend == "openvino"
    fly = pair_for("y", (), "smollm2-135m", torch_pair=True, on_the_fly=(12, 3))
    assert fly.target.backend == fly.draft.backend == "torch"
    assert fly.draft.args()[-2:] == ["--skip-on-the-fly", "12,3"]
    assert "--skip-on-the-fly" not in pair_for("z", (), "m", torch_pair=True).draft.args()
