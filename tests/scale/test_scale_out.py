"""Issue 17's runs: two Ray nodes, the autoscaling ramp, pools of different sizes and
rolling replacement; every generation checked against target-only output."""

from __future__ import annotations

import pytest

from specdec_tools.scale import pool_scenarios, ray_scenarios
from tests.scale.conftest import FULL, MARKS, show, size

pytestmark = MARKS
LIMIT = 1800 if FULL else 600


@pytest.mark.timeout(LIMIT)
def test_replicas_on_two_nodes_serve_clients_of_both_proxies_exactly():
    r = ray_scenarios.multinode(size(ray_scenarios))
    show("multinode", r)
    assert len(r["nodes"]) == 2
    assert sorted(r["replicas_per_node"].values()) == [1, 1]  # one replica on each node
    assert set(r["nodes_serving"]) == set(r["nodes"])  # both replicas served generations
    assert {x["proxy"].rsplit(":", 1)[0] for x in r["served"]} == set(r["nodes"])
    assert r["generations"] > 0 and not r["errors"] and r["exact"], r["mismatches"]


@pytest.mark.timeout(LIMIT)
def test_serve_scales_up_and_down_under_a_ramp_without_losing_a_generation():
    s = size(ray_scenarios)
    r = ray_scenarios.autoscale(s)
    show("autoscale", r)
    assert r["peak_running"] == s.max_replicas
    assert r["scale_up_full_s"] is not None and r["scale_down_s"] is not None
    # replicas on both nodes at the peak (at most ceil(max / 2) a node)
    peak = max(r["timeline"], key=lambda x: sum(x["nodes"].values()))
    assert len(peak["nodes"]) == 2
    assert r["timeline"][-1]["running"] == 1
    assert r["generations"] > 0 and not r["errors"] and r["exact"], r["mismatches"]


@pytest.mark.timeout(LIMIT)
def test_pools_of_different_sizes_spread_repin_and_admit_replicas():
    r = pool_scenarios.pools(size(pool_scenarios))
    show("pools", r)
    two_drafts, two_targets, killed, added = r["phases"]
    assert set(two_drafts["by_draft"]) == {"d1", "d2"}  # spread over both drafts
    assert set(two_targets["by_target"]) == {"t1", "t2"}  # ... and both targets
    # d2 left the list: the generations on it moved to d1; none since went to d2
    assert set(two_targets["by_draft"]) == {"d1"}
    assert killed["target_repinned"] >= 1 or two_targets["target_repinned"] >= 1
    assert "t3" in added["by_target"]  # a replica added is used by new generations
    assert {"t1", "t2", "t3", "d1", "d2"} <= set(r["metrics"])  # per-replica load reported
    assert r["metrics"]["t1"]["specdec_target_inflight_verify_requests"]["peak"] >= 1
    assert r["generations"] > 0 and not r["errors"] and r["exact"], r["mismatches"]


@pytest.mark.timeout(LIMIT)
def test_rolling_replacement_under_load_changes_no_output_and_shows_no_error():
    r = pool_scenarios.rolling(size(pool_scenarios))
    show("rolling", r)
    assert [(x["role"], x["old"]) for x in r["replacements"]] == [
        ("target", "t1"), ("target", "t2"), ("draft", "d1"), ("draft", "d2")]
    assert r["target_repinned"] > 0 and r["draft_repinned"] > 0  # generations moved
    assert r["generations"] > 0 and not r["errors"] and r["exact"], r["mismatches"]
