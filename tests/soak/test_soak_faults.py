"""The soak with faults (specdec_tools.soak.cli), as `make test` runs it: the short form
(tiny models,
12 streams, 40 s, ~90 s in all) with the same three faults as the full form. `make
test-soak` runs the full form (SPECDEC_SOAK=full: the default pair, 32 streams, 120 s).

Real processes: one draft, two target replicas, a Ray Serve coordinator over both
targets; real gRPC clients. Passes only when the soak's own verdict does; a failed check
is shown with the figures.
"""

from __future__ import annotations

import json
import os

import pytest

from specdec_tools.soak.cli import SHORT, SoakConfig, soak
from specdec_tools.soak.report import render

pytestmark = [pytest.mark.soak, pytest.mark.slow]

FULL = os.environ.get("SPECDEC_SOAK", "short") == "full"


@pytest.mark.timeout(1500 if FULL else 420)
def test_soak_with_faults(tmp_path):
    cfg = SoakConfig(log_dir=str(tmp_path / "logs")) if FULL else \
        SoakConfig(**SHORT, log_dir=str(tmp_path / "logs"))
    figures = soak(cfg, say=print)
    text = render(figures)
    print(text)
    (tmp_path / "soak.json").write_text(json.dumps(figures, indent=2))
    g = figures["generations"]
    # The run is meaningful: every fault happened and every kind of traffic completed.
    assert [f["name"] for f in figures["faults"]] == ["draft-kill", "target-kill",
                                                        "target-restart"]
    assert g["greedy_completed"] > 0 and g["sampled_completed"] > 0 and g["cancelled"] > 0
    failed = [c for c in figures["checks"] if not c["passed"]]
    assert not failed, "soak checks failed (logs in " + str(tmp_path / "logs") + "):\n" + text
