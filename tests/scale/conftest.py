"""Scale-out runs (specdec_tools.scale): real hosts as network namespaces on one LAN, a real
multi-node Ray cluster, real services and clients. Skipped, with the reason, where
namespaces cannot be made. SPECDEC_SCALE=full (`make test-scale`) runs the full form;
the default is CI's short form. Each test prints its figures (pytest -s shows them)."""

from __future__ import annotations

import os

import pytest

from specdec_tools.netns.network import namespaces_permitted

PERMITTED, WHY = namespaces_permitted()
FULL = os.environ.get("SPECDEC_SCALE", "short") == "full"


MARKS = [pytest.mark.scale, pytest.mark.slow,
         pytest.mark.skipif(not PERMITTED, reason=f"no network namespaces: {WHY}")]


def size(module):
    return module.FULL if FULL else module.SHORT


def show(name: str, report: dict) -> None:
    from specdec_tools.scale.report import SECTIONS

    title, render = SECTIONS[name]
    print(f"\n### {title} ({'full' if FULL else 'short'} form)\n")
    print("\n".join(render(report)))
