"""The OpenVINO backend on a tiny model exported to IR in the test run."""

from __future__ import annotations

import os

import pytest
import torch

from specdec.runtime.models import TINY_TARGET, load
from specdec.runtime.openvino_backend import (
    ISA_CAP,
    ISA_CAP_VAR,
    OpenVINOBackend,
    cap_cpu_isa_below_amx,
)
from specdec.runtime.openvino_export import export_tiny, is_exported
from specdec.runtime.torch_backend import TorchBackend

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def ir_dir(tmp_path_factory):
    return export_tiny(TINY_TARGET, "fp32", tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module", params=["mask", "trim", "mask-compact-often"])
def backend(ir_dir, request):
    """Both rollback strategies; the third compacts after every 2 dead entries."""
    rollback, _, _ = request.param.partition("-")
    max_stale = 2 if request.param.endswith("often") else 64
    return OpenVINOBackend(ir_dir, "CPU", threads=1, model_id=TINY_TARGET,
                           rollback=rollback, max_stale=max_stale)


def fresh(backend, tokens, keep_last=1):
    return backend.forward(backend.new_cache(), tokens, keep_last)


def test_export_is_cached_and_reports_the_tiny_model(ir_dir, backend):
    assert is_exported(ir_dir, ir_dir.parent / ir_dir.name.rsplit("-ov-", 1)[0])
    assert export_tiny(TINY_TARGET, "fp32", ir_dir.parent.parent) == ir_dir  # cache hit
    torch_model = load(TINY_TARGET)
    assert backend.loaded.model_id == TINY_TARGET
    assert backend.vocab_size == torch_model.vocab_size
    assert backend.loaded.tokenizer_digest == torch_model.tokenizer_digest


def test_logits_match_torch_with_f32_kv_cache(backend):
    reference = TorchBackend(load(TINY_TARGET))
    ov = fresh(backend, PROMPT, keep_last=4)
    pt = reference.forward(reference.new_cache(), PROMPT, 4)
    torch.testing.assert_close(ov, pt, rtol=1e-3, atol=1e-3)
    assert ov.argmax(-1).tolist() == pt.argmax(-1).tolist()


@pytest.mark.parametrize("keep", [0, 1, 4, 8])
def test_crop_then_extend_matches_fresh_prefill(backend, keep):
    cache = backend.new_cache()
    backend.forward(cache, PROMPT + [700, 701, 702])  # three rejected drafts
    backend.crop(cache, keep)
    assert backend.cache_len(cache) == keep
    follow = [42, 43]
    got = backend.forward(cache, PROMPT[keep:] + follow, keep_last=2)
    torch.testing.assert_close(got, fresh(backend, PROMPT + follow, 2), rtol=1e-4, atol=1e-4)


def test_masked_rollback_keeps_dead_entries_until_compaction(ir_dir):
    backend = OpenVINOBackend(ir_dir, "CPU", threads=1, rollback="mask", max_stale=4)
    cache = backend.new_cache()
    backend.forward(cache, PROMPT)
    backend.forward(cache, [700, 701, 702])
    backend.crop(cache, len(PROMPT))
    assert (backend.cache_len(cache), len(cache.live)) == (len(PROMPT), len(PROMPT) + 3)
    backend.forward(cache, [703, 704])
    backend.crop(cache, len(PROMPT))  # 5 dead entries >= 4: compacted
    assert len(cache.live) == len(PROMPT) and cache.live.all()


def test_repeated_rollbacks_stay_consistent(backend):
    cache = backend.new_cache()
    committed = list(PROMPT)
    backend.forward(cache, committed)
    for step in range(5):
        backend.forward(cache, [600 + step, 601 + step])  # drafts, all rejected
        backend.crop(cache, len(committed))
        committed.append(10 + step)
        backend.forward(cache, committed[-1:])
    torch.testing.assert_close(backend.forward(cache, [5]), fresh(backend, committed + [5]),
                               rtol=1e-4, atol=1e-4)


def test_interleaved_sessions_do_not_disturb_each_other(backend):
    prompts = [[1, 2, 3], [400, 500], [7, 7, 7, 7]]
    alone = []
    for p in prompts:
        cache, ids = backend.new_cache(), []
        logits = backend.forward(cache, p)[0]
        for _ in range(6):
            ids.append(int(logits.argmax()))
            logits = backend.forward(cache, ids[-1:])[0]
        alone.append(ids)
    caches = [backend.new_cache() for _ in prompts]
    logits = [backend.forward(c, p)[0] for c, p in zip(caches, prompts, strict=True)]
    together: list[list[int]] = [[] for _ in prompts]
    for _ in range(6):
        for i, cache in enumerate(caches):
            together[i].append(int(logits[i].argmax()))
            logits[i] = backend.forward(cache, together[i][-1:])[0]
    assert together == alone


def test_unavailable_device_is_a_clear_error(ir_dir):
    with pytest.raises(ValueError, match="not available"):
        OpenVINOBackend(ir_dir, "NPU")


def test_int8_weights_and_u8_kv_cache_run(tmp_path):
    ir = export_tiny(TINY_TARGET, "int8", tmp_path)
    backend = OpenVINOBackend(ir, "CPU", threads=1, kv_cache_precision="u8")
    logits = fresh(backend, PROMPT)
    assert logits.shape == (1, backend.vocab_size) and torch.isfinite(logits).all()


def test_inference_precision_is_a_setting(ir_dir):
    f32 = OpenVINOBackend(ir_dir, "CPU", threads=1)
    assert f32.inference_precision == "f32"  # the default keeps a target faithful
    auto = OpenVINOBackend(ir_dir, "CPU", threads=1, inference_precision="auto")
    assert auto.inference_precision in ("f32", "bf16", "f16")  # what the plugin chose
    logits = fresh(auto, PROMPT)
    assert torch.isfinite(logits).all()
    # Whatever it computes in, the most likely next token barely moves on this model.
    assert int(logits.argmax()) == int(fresh(f32, PROMPT).argmax())
    with pytest.raises(ValueError, match="inference precision"):
        OpenVINOBackend(ir_dir, "CPU", threads=1, inference_precision="fp64")


def test_cpu_isa_cap_only_on_amx_and_never_over_the_users(tmp_path, monkeypatch):
    monkeypatch.setenv(ISA_CAP_VAR, "recorded, so that the test leaves it as it was")
    monkeypatch.delenv(ISA_CAP_VAR)
    plain, amx = tmp_path / "plain", tmp_path / "amx"
    plain.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n")
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n")
    assert not cap_cpu_isa_below_amx(str(plain)) and ISA_CAP_VAR not in os.environ
    assert cap_cpu_isa_below_amx(str(amx)) and os.environ[ISA_CAP_VAR] == ISA_CAP
    monkeypatch.setenv(ISA_CAP_VAR, "AVX512_CORE_AMX")
    assert not cap_cpu_isa_below_amx(str(amx)) and os.environ[ISA_CAP_VAR] == "AVX512_CORE_AMX"
    assert not cap_cpu_isa_below_amx(str(tmp_path / "missing"))
