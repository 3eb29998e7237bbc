"""specdec_tools.scale.report on synthetic reports (pure)."""

from __future__ import annotations

from specdec_tools.scale.report import markdown

CHECKED = dict(generations=10, errors=[], mismatches=[], exact=True, seconds=5.0)
REPORTS = {
    "multinode": dict(nodes=["10.0.0.2", "10.0.0.3"],
                      replicas_per_node={"10.0.0.2": 1, "10.0.0.3": 1},
                      nodes_serving=["10.0.0.2", "10.0.0.3"],
                      served=[{"proxy": "10.0.0.2:50050", "node": "10.0.0.2",
                               "generations": 6}], **CHECKED),
    "autoscale": dict(streams=[1, 16, 1], min_replicas=1, max_replicas=3, peak_running=3,
                      scale_up_first_s=12.7, scale_up_full_s=26.3, scale_down_s=None,
                      drain_s=[2.1], timeline=[{"t": 0.5, "running": 2,
                                                "nodes": {"10.0.0.2": 2},
                                                "states": {"RUNNING": 2}}], **CHECKED),
    "pools": dict(phases=[{"phase": "2 drafts : 1 target", "generations": 4,
                           "by_draft": {"d1": 2, "d2": 2}, "by_target": {"t1": 4},
                           "draft_repinned": 0, "target_repinned": 1, "errors": []}],
                  metrics={"t1": {"specdec_target_inflight_verify_requests":
                                  {"peak": 4.0, "mean": 0.5}}}, **CHECKED),
    "rolling": dict(replacements=[{"role": "target", "old": "t1", "new": "t3",
                                   "new_ready_s": 11.0, "drain_s": 3.5, "step_s": 17.0}],
                    target_repinned=7, draft_repinned=8, **CHECKED),
    "sizing": dict(pair="p", max_new_tokens=64, rows=[dict(
        mode="speculative", streams=4, tok_s=60.0, rounds_s=14.0, verified_tok_s=70.0,
        drafted_tok_s=56.0, acceptance=0.9, busy={"target": 0.5, "draft": 0.93},
        coordinator_cpu_ms_per_round=3.2, rpcs_per_round=2.1, bytes_per_round=190)],
        **CHECKED),
}


def test_every_run_renders_its_figures():
    md = markdown({"command": "specdec bench-scale", "date": "d", "form": "short"}, REPORTS)
    assert "### Two Ray nodes (5.0 s)" in md and "10.0.0.2: 1, 10.0.0.3: 1" in md
    assert "all 3 at 26.3 s" in md and "scale down to 1: -" in md  # None shows as -
    assert "| 0.5 | 2 | 10.0.0.2: 2 | RUNNING 2 |" in md
    assert "| 2 drafts : 1 target | 4 | d1 2, d2 2 | t1 4 | 0 / 1 | 0 |" in md
    assert "| t1 | specdec_target_inflight_verify_requests | 4 | 0.5 |" in md
    assert "| target t1 | t3 | 11.0 s | 3.5 s | 17.0 s |" in md
    assert "10 generations checked, 0 errors, 0 outputs changed" in md
    assert "| speculative | 4 | 60.0 | 14.0 | 70.0 | 56.0 | 0.90 | 50% | 93% | 3.2 | 2.1 " \
        "| 190 |" in md
