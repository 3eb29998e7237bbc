"""OpenVINO's dynamic quantization of activations over int8 weights: on (the plugin's
default), a position's logits change with how many tokens its pass holds, and the backend
says so; off, they depend on the prefix alone, which contrastive decoding's amateur needs."""

from __future__ import annotations

import pytest
import torch

from specdec.runtime.models import TINY_DRAFT
from specdec.runtime.openvino_backend import OpenVINOBackend
from specdec.runtime.openvino_export import export_tiny
from specdec.runtime.openvino_paged import PagedOpenVINOBackend

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
TAIL = [7, 11, 13, 17, 19, 23]


@pytest.fixture(scope="module")
def ir_dir(tmp_path_factory):
    return export_tiny(TINY_DRAFT, "int8", tmp_path_factory.mktemp("home"))


def rows(backend, chunk: int) -> torch.Tensor:
    """The logits after each token of TAIL, fed `chunk` tokens per pass."""
    cache = backend.new_cache()
    backend.forward(cache, PROMPT, keep_last=1)
    out = []
    for i in range(0, len(TAIL), chunk):
        part = TAIL[i:i + chunk]
        out.append(backend.forward(cache, part, keep_last=len(part)))
    return torch.cat(out)


@pytest.mark.parametrize("kind", [PagedOpenVINOBackend])
def test_off_gives_logits_that_do_not_depend_on_the_pass(ir_dir, kind):
    on = kind(ir_dir, "CPU", threads=1, model_id=TINY_DRAFT, compressed_weights=True)
    off = kind(ir_dir, "CPU", threads=1, model_id=TINY_DRAFT, compressed_weights=True,
               dynamic_quantization=False)
    assert on.batch_dependent_logits and not off.batch_dependent_logits
    one = rows(off, 1)
    for chunk in (2, 3, 6):
        assert torch.allclose(rows(off, chunk), one, atol=1e-4)
    print("dynamic quantization on: max |logit change| with the pass size",
          float((rows(on, 6) - rows(on, 1)).abs().max()))


def test_on_the_paged_backend_feeds_every_position_as_one_token(ir_dir):
    """With the quantization on, a sequence fed one new token is computed another way
    than one fed two or more; the paged backend feeds every position as its own one-token
    subsequence, so a position's logits are bit-equal whatever its pass held (the
    target's greedy output stays target-only's with int8 weights and the quantization
    on). Without that, the rows differ (the test would catch a plugin that changed)."""
    on = PagedOpenVINOBackend(ir_dir, "CPU", threads=1, model_id=TINY_DRAFT,
                              compressed_weights=True)
    one = rows(on, 1)
    for chunk in (2, 3, 6):
        assert torch.equal(rows(on, chunk), one), chunk
    other = on.new_cache()  # a second session in the same passes changes nothing
    on.forward(other, [5, 5, 5], keep_last=1)
    cache = on.new_cache()
    on.forward(cache, PROMPT, keep_last=1)
    together = on.forward_batch([(cache, TAIL[:1], 1), (other, [8], 1)])[0]
    assert torch.equal(together, one[:1])
    on.one_token_rows = False  # the draft's setting: chunks are computed another way
    assert not all(torch.equal(rows(on, chunk), rows(on, 1)) for chunk in (2, 3, 6))



@pytest.mark.parametrize("kind", [PagedOpenVINOBackend, OpenVINOBackend])
def test_a_group_size_reaches_the_plugin_and_rows_stay_pass_independent(ir_dir, kind):
    """--dynamic-quantization GROUP: the plugin quantizes in groups of GROUP, and the
    paged backend's one-token rows keep a position's logits bit-equal whatever its pass
    held, as at the default group size (64 divides this model's widths, 64 and 128)."""
    backend = kind(ir_dir, "CPU", threads=1, model_id=TINY_DRAFT, compressed_weights=True,
                   dynamic_quantization_group=64)
    assert int(backend.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")) == 64
    if kind is PagedOpenVINOBackend:
        one = rows(backend, 1)
        for chunk in (2, 6):
            assert torch.equal(rows(backend, chunk), one), chunk


def test_a_group_that_does_not_divide_the_widths_is_refused(ir_dir):
    """Group 128 on a model 64 wide: its rows changed with the pass even fed one token
    at a time (measured before this check), so the backend refuses it and says why."""
    with pytest.raises(ValueError, match=r"does not divide this model's matmul widths \[64\]"):
        PagedOpenVINOBackend(ir_dir, "CPU", threads=1, model_id=TINY_DRAFT,
                             compressed_weights=True, dynamic_quantization_group=128)
