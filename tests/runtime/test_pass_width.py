"""specdec bench-pass-width on the real paged OpenVINO backend (tiny model): which
passes it times, that a session grows by one token per pass as a rejected Verify's
does, what it writes, and its replay of the look-up."""

from __future__ import annotations

import json

import pytest

from specdec.cli import main
from specdec.runtime.models import TINY_TARGET
from specdec.runtime.openvino_export import export_tiny
from specdec.runtime.openvino_paged import PagedOpenVINOBackend
from specdec_tools.bench.pass_width import WARM, markdown, measure


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    ir_dir = export_tiny(TINY_TARGET, "fp32", tmp_path_factory.mktemp("home"))
    return PagedOpenVINOBackend(ir_dir, "CPU", threads=1, model_id=TINY_TARGET)


def test_runs_feed_the_widths_asked_and_grow_by_one_token_a_pass(backend):
    fed = []  # (cached length before, width) of every pass after a prompt
    forward = backend.forward_batch

    def recording(items):
        (cache, tokens, keep), = items
        assert keep == (1 if len(tokens) == 8 else len(tokens))  # a Verify's: all rows
        fed.append((backend.cache_len(cache), len(tokens)))
        return forward(items)

    backend.forward_batch = recording
    try:
        rows = measure(backend, backend.vocab_size, [1, 3], passes=4, repeats=1,
                       prompt_tokens=8, progress=False)
    finally:
        del backend.forward_batch
    runs, run = [], []
    for length, width in fed:
        if width == 8:  # a prompt: a new run starts
            run = []
            runs.append(run)
        else:
            run.append((length, width))
    assert [[w for _, w in r] for r in runs] == [[1] * 6, [3] * 6, [1, 3] * 3]
    for r in runs:
        assert [n for n, _ in r] == list(range(8, 8 + len(r)))  # cropped back to +1
    assert [r["width"] for r in rows] == [1, 3]
    assert all(r["constant_ms"] > 0 for r in rows)
    assert {"alternating_ms", "alternating_width1_ms", "change_ms", "per_draft"} <= set(rows[1])
    assert rows[1]["change_ms"] == pytest.approx(rows[1]["alternating_ms"]
                                                 - rows[1]["constant_ms"])
    assert len(runs[0]) == 4 + WARM
    table = markdown(rows, {"command": "specdec bench-pass-width", "date": "d", "backend": "b"})
    assert "| 3 |" in table and "| 1 |" in table


def test_cli_writes_json_markdown_and_plot(tmp_path, capsys):
    assert main(["bench-pass-width", "--model", "tiny-random", "--widths", "2",
                 "--passes", "2", "--repeats", "1", "--prompt-tokens", "4",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "pass_width.json").read_text())
    assert [r["width"] for r in data["rows"]] == [1, 2]
    assert (tmp_path / "pass_width.png").stat().st_size > 0
    assert "a width change costs" in (tmp_path / "pass_width.md").read_text()
    assert main(["bench-pass-width", "--widths", "0,2", "--out", str(tmp_path)]) == 2
    assert main(["bench-pass-width", "--passes", "1", "--out", str(tmp_path)]) == 2


def test_cli_replays_the_look_up_over_the_targets_greedy_text(tmp_path):
    assert main(["bench-pass-width", "--model", "tiny-random", "--widths", "2",
                 "--passes", "2", "--repeats", "1", "--replay", "code",
                 "--replay-tokens", "12", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "pass_width.json").read_text())
    assert [r["width"] for r in data["rows"]] == list(range(1, 10))  # every look-up width
    (code,) = data["replay"]
    assert code["prompt"] == "code" and 1 <= code["tokens"] <= 12
    assert code["speedup"] <= code["speedup_free_changes"]
    assert "replayed speedup" in (tmp_path / "pass_width.md").read_text()
    with pytest.raises(SystemExit, match="unknown prompt"):
        main(["bench-pass-width", "--model", "tiny-random", "--widths", "2", "--passes", "2",
              "--repeats", "1", "--replay", "poetry", "--out", str(tmp_path)])


def test_each_pass_feeds_every_session_the_width(backend):
    fed = []  # per pass: (cached lengths before, widths)
    forward = backend.forward_batch

    def recording(items):
        fed.append(([backend.cache_len(c) for c, _, _ in items], [len(t) for _, t, _ in items]))
        return forward(items)

    backend.forward_batch = recording
    try:
        rows = measure(backend, backend.vocab_size, [1, 2], passes=2, repeats=1,
                       prompt_tokens=5, progress=False, sessions=3)
    finally:
        del backend.forward_batch
    assert all(len(widths) == 3 and len(set(widths)) == 1 for _, widths in fed)
    runs = []
    for lengths, widths in fed:
        if widths[0] == 5:  # the sessions' prompts: a new run starts
            runs.append([])
        else:
            runs[-1].append((lengths, widths[0]))
    assert [[w for _, w in r] for r in runs] == [[1] * 4, [2] * 4, [1, 2] * 2]
    for r in runs:  # every session cropped back to one more token a pass
        assert [lengths for lengths, _ in r] == [[n] * 3 for n in range(5, 5 + len(r))]
    assert [r["width"] for r in rows] == [1, 2]


def test_cli_sessions_and_activation_groups(tmp_path):
    assert main(["bench-pass-width", "--model", "tiny-random", "--weights", "int8",
                 "--dynamic-quantization", "64", "--sessions", "2", "--widths", "2",
                 "--passes", "2", "--repeats", "1", "--prompt-tokens", "4",
                 "--out", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "pass_width.json").read_text())["meta"]
    assert "int8 weights" in meta["backend"] and "activation quantization 64" in meta["backend"]
    assert "2 session(s) a pass" in meta["backend"]
    assert main(["bench-pass-width", "--sessions", "0", "--out", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):  # argparse: not a multiple of 32
        main(["bench-pass-width", "--dynamic-quantization", "48", "--out", str(tmp_path)])
