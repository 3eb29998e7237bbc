"""specdec_tools.soak.report's RSS check: growth from the baseline, less the KV pool's growth."""

from __future__ import annotations

from types import SimpleNamespace

from specdec_tools.soak.report import _rss


def test_kv_pool_growth_is_not_counted_but_other_growth_is():
    series = {("target-b", 7): [("after target-restart", 58.0, 1470.0), ("t=90s", 90.0, 2170.0),
                                ("end", 130.0, 2280.0)],
              ("draft", 8): [("ready", 0.0, 560.0), ("warm", 1.0, 570.0),
                             ("end", 130.0, 700.0)]}
    pool = {("target-b", 7): [(58.0, 16.0), (90.0, 512.0), (130.0, 1024.0)],
            ("draft", 8): [(0.0, 8.0), (1.0, 8.0), (130.0, 8.0)]}
    table, over = _rss(SimpleNamespace(series=series, pool=pool), 100.0)
    b = table["target-b [7]"]["checked"]
    assert b["kv_pool_growth_mib"] == 512.0  # from t=90 s (its second half) to the end
    assert b["growth_mib"] == 110.0 - 512.0 and b["ok"]
    d = table["draft [8]"]["checked"]
    assert d["kv_pool_growth_mib"] == 0.0 and d["growth_mib"] == 130.0 and not d["ok"]
    assert over == ["draft (pid 8) grew 130.0 MiB from warm"]


def test_without_pool_figures_all_growth_counts():
    series = {("coordinator/raylet", 9): [("ready", 0.0, 30.0), ("warm", 1.0, 30.0),
                                          ("end", 9.0, 31.5)]}
    table, over = _rss(SimpleNamespace(series=series, pool={}), 100.0)
    assert table["coordinator/raylet [9]"]["checked"]["growth_mib"] == 1.5 and not over
