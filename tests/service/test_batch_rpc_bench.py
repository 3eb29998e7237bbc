"""`specdec bench-batch-rpc` against the tiny servers: both modes run lockstep steps with
correct cache-sync fields, report the target's passes, and write JSON, Markdown and PNG."""

from __future__ import annotations

import json

from specdec_tools.bench import batch_rpc


def test_both_modes_run_and_report_sessions_per_pass(target_server, draft_server, tmp_path):
    rows = batch_rpc.bench(target_server[0], draft_server[0], sessions=[1, 2], steps=3,
                           warmup=1, k=2, prompt_tokens=12, progress=False)
    assert [(r["sessions"], r["mode"]) for r in rows] == \
        [(1, "batch"), (1, "concurrent"), (2, "batch"), (2, "concurrent")]
    for r in rows:
        assert r["step_ms"] > 0 and r["client_cpu_ms"] > 0
        assert r["target_passes"] > 0
        assert 1 <= r["sessions_per_pass"] <= r["sessions"]
        assert r["target_cpu_ms"] is None  # services not started here: not read
    batch_2 = next(r for r in rows if (r["sessions"], r["mode"]) == (2, "batch"))
    assert batch_2["sessions_per_pass"] == 2  # one VerifyBatch, one pass
    assert batch_2["tokens_per_pass"] == 2 * 3  # 1 committed + K drafts each

    meta = {"command": "specdec bench-batch-rpc (test)", "date": "today",
            "services": "tiny", "k": 2, "steps": 3, "warmup": 1, "prompt_tokens": 12,
            "via": "futures"}
    paths = batch_rpc.write(rows, meta, tmp_path / "out")
    assert all(p.stat().st_size > 0 for p in paths.values())
    assert json.loads(paths["json"].read_text())["rows"] == rows
    md = paths["md"].read_text()
    assert "sessions/pass" in md and "| 2 | concurrent |" in md


def test_threads_via_and_the_cli_parser(target_server, draft_server, tmp_path):
    from specdec.cli import parser

    out = tmp_path / "cli"
    args = parser().parse_args(["bench-batch-rpc", "--target", target_server[0], "--draft",
                                draft_server[0], "--sessions", "2", "--steps", "2",
                                "--warmup", "0", "--k", "1", "--prompt-tokens", "8",
                                "--concurrent-via", "threads", "--out", str(out)])
    assert args.func(args) == 0
    rows = json.loads((out / "batch_rpc.json").read_text())["rows"]
    assert {r["mode"] for r in rows} == {"batch", "concurrent"}
    assert (out / "batch_rpc.png").exists() and (out / "batch_rpc.md").exists()
