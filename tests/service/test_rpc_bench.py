"""`specdec rpc-bench` runs end to end and reports consistent figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdec_tools import rpcbench
from tests.procs import ROOT


def test_rpc_bench_greedy_is_exact_and_consistent():
    r = rpcbench.run(generations=3, max_new_tokens=24, k=4)
    assert r.exact is True
    assert 0 < r.acceptance_rate < 1 and r.acceptance_rate <= r.alpha < 1
    assert 1 < r.tokens_per_round <= 5
    assert r.propose_reply_bytes_median < 64  # greedy: tokens only, no distributions
    assert r.propose_ms_median > 0 and r.verify_ms_p90 >= r.verify_ms_median


@pytest.mark.slow
def test_rpc_bench_cli_sampled_json():
    run = subprocess.run(
        [sys.executable, "-m", "specdec.cli", "rpc-bench", "--generations", "2",
         "--max-new-tokens", "16", "--temperature", "1.0", "--top-n", "16", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    assert r["exact"] is None and r["top_n"] == 16
    # K=4 sparse dists of <= 16 ids each: well under 2 KB per round.
    assert 0 < r["propose_reply_bytes_median"] < 1024
