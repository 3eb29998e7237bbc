"""The IR's mapped weight pages leave RSS once the plugin has repacked them, and the
model computes the same logits after."""

from __future__ import annotations

import sys

import pytest
import torch

from specdec.runtime import mapped_weights
from specdec.runtime.models import TINY_DRAFT
from specdec.runtime.openvino_export import export_tiny
from specdec.runtime.openvino_paged import PagedOpenVINOBackend

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def logits(backend) -> torch.Tensor:
    cache = backend.new_cache()
    first = backend.forward(cache, [3, 1, 4, 1, 5, 9, 2, 6], keep_last=3)
    rest = [backend.forward(cache, [t], keep_last=1) for t in (7, 11, 13)]
    return torch.cat([first, *rest])


@pytest.mark.parametrize("weights", ["int8", "fp32"])
def test_release_drops_the_pages_and_changes_no_logit(tmp_path, weights):
    ir = export_tiny(TINY_DRAFT, weights, tmp_path)
    backend = PagedOpenVINOBackend(ir, "CPU", threads=1, model_id=TINY_DRAFT,
                                   compressed_weights=weights != "fp32")
    before = logits(backend)
    bin_file = backend.weights_file
    assert mapped_weights.mappings(bin_file), "OpenVINO no longer maps the IR's weights"
    assert all("w" not in perms for _, _, perms in mapped_weights.mappings(bin_file))
    assert mapped_weights.resident_bytes(bin_file) > 0
    assert backend.release_mapped_weights() >= bin_file.stat().st_size
    assert mapped_weights.resident_bytes(bin_file) == 0
    assert torch.equal(logits(backend), before)


def test_a_file_not_mapped_releases_nothing(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 4096)
    assert mapped_weights.mappings(path) == []
    assert mapped_weights.release(path) == 0 and mapped_weights.resident_bytes(path) == 0
