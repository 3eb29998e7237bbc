"""A clone holds everything it cites: no tracked file points outside the repository."""

from __future__ import annotations

import subprocess

from specdec.launcher import ROOT

OUTSIDE = ("../shared", "DESIGN.md", "/work/")


def test_no_tracked_file_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    hits = []
    for name in files:
        if name == "tests/unit/test_self_contained.py":
            continue
        try:
            text = (ROOT / name).read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary (plots) or gone from the work tree
        hits += [f"{name}: {needle}" for needle in OUTSIDE if needle in text]
    assert not hits, "files citing what a clone does not have:\n" + "\n".join(hits)


def test_the_design_document_is_in_the_repository_and_linked():
    assert (ROOT / "docs" / "design.md").is_file()
    assert "docs/design.md" in (ROOT / "README.md").read_text()
