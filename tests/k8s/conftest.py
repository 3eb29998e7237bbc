"""Rendered kustomize overlays, shared by the tests in tests/k8s (rendered once)."""

from __future__ import annotations

import pytest
from k8s_objects import COMPONENTS, K8S, OVERLAYS, NoKustomize, Rendered, kustomize_command
from k8s_objects import render as _render
from k8s_objects import render_with_components as _render_with_components

# Every render the tests look at: each overlay as shipped, and overlays with components.
VARIANTS = {
    **{o: (o, []) for o in OVERLAYS},
    "cpu+model-pvc+manual-scaling": ("cpu", list(COMPONENTS)),
    "gpu+model-pvc": ("gpu", ["model-pvc"]),
}


@pytest.fixture(scope="session")
def kustomize() -> list[str]:
    """The kustomize command line; the test is skipped where there is none."""
    try:
        return kustomize_command()
    except NoKustomize as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def renders(kustomize, tmp_path_factory) -> dict[str, Rendered]:
    out = {}
    for name, (overlay, components) in VARIANTS.items():
        if components:
            objs = _render_with_components(tmp_path_factory.mktemp("kustomize"), overlay,
                                           components)
        else:
            objs = _render(K8S / "overlays" / overlay)
        out[name] = Rendered(name, objs)
    return out


@pytest.fixture(params=list(VARIANTS))
def rendered(request, renders) -> Rendered:
    return renders[request.param]


@pytest.fixture(params=list(OVERLAYS))
def overlay(request, renders) -> Rendered:
    return renders[request.param]
