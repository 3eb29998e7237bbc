"""specdec.runtime.layer_skip: skip sets as written, validated against the model, and a
model with layers dropped that computes what its kept layers compute, cache included."""

from __future__ import annotations

import argparse

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM

from specdec.runtime.layer_skip import arg, drop_layers, format_set, parse, validate
from specdec.runtime.models import TINY_TARGET, build_tiny


def test_sets_are_read_as_written():
    assert parse("3,5,7") == (3, 5, 7)
    assert parse(" 9, 2-4 ,3") == (2, 3, 4, 9)
    assert parse("") == ()
    assert format_set(parse("7,3,5")) == "3,5,7"


def test_a_set_is_read_from_a_file(tmp_path):
    f = tmp_path / "best.txt"
    f.write_text("4,1-2\n# written by specdec tune-skip\n")
    assert parse(f"@{f}") == (1, 2, 4)
    with pytest.raises(ValueError, match="cannot read"):
        parse(f"@{tmp_path / 'missing.txt'}")


@pytest.mark.parametrize(("text", "fragment"), [
    ("3,x", "'x' is not a layer index"), ("5-2", "not a range"), ("-1", "is not a layer index")])
def test_bad_sets_say_what_is_wrong(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse(text)
    with pytest.raises(argparse.ArgumentTypeError, match=fragment):
        arg(text)


def test_sets_are_checked_against_the_model():
    validate((0, 29), 30)
    with pytest.raises(ValueError, match=r"has 30 decoder layers \(0-29\); 30,31 is not"):
        validate((1, 30, 31), 30)
    with pytest.raises(ValueError, match="skips all 2 decoder layers"):
        validate((0, 1), 2)


def kept_layer_model(loaded, keep: int) -> LlamaForCausalLM:
    """A fresh one-layer model holding layer `keep`'s weights, built by hand."""
    config = type(loaded.model.config)(**loaded.model.config.to_dict())
    config.num_hidden_layers = 1
    model = LlamaForCausalLM(config).eval()
    state = {}
    for key, value in loaded.model.state_dict().items():
        if key.startswith("model.layers."):
            index, rest = key[len("model.layers."):].split(".", 1)
            if int(index) != keep:
                continue
            key = f"model.layers.0.{rest}"
        state[key] = value
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("skip", [(0,), (1,)])
def test_the_pruned_model_is_its_kept_layers_with_a_cache(skip):
    loaded = build_tiny(TINY_TARGET)
    want_model = kept_layer_model(loaded, 1 - skip[0])
    drop_layers(loaded.model, skip)
    model = loaded.model
    assert model.config.num_hidden_layers == 1 and len(model.model.layers) == 1
    assert model.model.layers[0].self_attn.layer_idx == 0  # renumbered
    ids = torch.tensor([[5, 17, 300, 42, 9, 611]])
    with torch.no_grad():
        want = want_model(ids).logits
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        first = model(ids[:, :4], past_key_values=cache, use_cache=True).logits
        rest = model(ids[:, 4:], past_key_values=cache, use_cache=True).logits
    assert torch.allclose(full, want, atol=1e-5)
    assert torch.allclose(torch.cat([first, rest], 1), want, atol=1e-5)
    assert cache.get_seq_length() == 6
    # Skipping really changes the model: the full one disagrees.
    with torch.no_grad():
        assert not torch.allclose(build_tiny(TINY_TARGET).model(ids).logits, full, atol=1e-3)


def test_prepare_takes_skip_sets_to_export():
    from specdec.prepare import add_prepare_parser

    p = argparse.ArgumentParser()
    add_prepare_parser(p.add_subparsers())
    args = p.parse_args(["prepare", "--openvino", "--skip-layers", "10-12",
                         "--skip-layers", "3,5"])
    assert args.skip_layers == [(10, 11, 12), (3, 5)]


def test_pruned_folders_are_named_by_their_set(tmp_path):
    from specdec.paths import ir_dir_for
    from specdec.runtime.layer_skip import pruned_dir_for

    folder = pruned_dir_for(tmp_path / "smollm2-135m", (3, 5, 7))
    assert folder == tmp_path / "smollm2-135m-skip3_5_7"
    assert ir_dir_for(folder, "int8").name == "smollm2-135m-skip3_5_7-ov-int8"


def test_skipped_is_the_pruned_model_inside_and_the_whole_one_after():
    from specdec.runtime.layer_skip import skipped

    loaded = build_tiny(TINY_TARGET)
    pruned = build_tiny(TINY_TARGET)
    drop_layers(pruned.model, (0,))
    ids = torch.tensor([[5, 17, 300, 42]])
    with torch.no_grad():
        whole = loaded.model(ids).logits
        with skipped(loaded.model, (0,)) as model:
            assert len(model.model.layers) == 1 and model.config.num_hidden_layers == 1
            inside = model(ids).logits
        after = loaded.model(ids).logits
    assert torch.allclose(inside, pruned.model(ids).logits, atol=1e-6)
    assert torch.equal(after, whole)
    assert loaded.model.config.num_hidden_layers == 2
    assert [layer.self_attn.layer_idx for layer in loaded.model.model.layers] == [0, 1]
