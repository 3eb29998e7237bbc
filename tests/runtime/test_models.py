"""The built-in tiny models: built in-process, deterministic, and a draft that half agrees."""

from __future__ import annotations

import builtins

import pytest
import torch

from specdec.runtime import models
from specdec.runtime.torch_backend import TorchBackend


def assert_same_weights(a, b) -> None:
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(),
                                   strict=True):
        assert torch.equal(pa, pb), name


@pytest.mark.parametrize("name", models.TINY_NAMES)
def test_tiny_models_build_deterministically_without_files(name, monkeypatch, tmp_path):
    """Nothing is loaded from disk or a hub: no from_pretrained, no file opened but
    Python sources; and two builds (even with the global RNG moved) are identical."""
    import transformers

    first = models.build_tiny(name)  # imports transformers before files are watched

    def no_loading(*_args, **_kwargs):
        raise AssertionError("a tiny model must not be loaded with from_pretrained")

    for cls in (transformers.PreTrainedModel, transformers.PretrainedConfig,
                transformers.PreTrainedTokenizerBase, transformers.AutoTokenizer,
                transformers.AutoModelForCausalLM, transformers.AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", no_loading)
    opened = []
    real_open = builtins.open

    def watched_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", watched_open)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "no-home"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(999)  # the build does not depend on the global RNG
        again = models.build_tiny(name)
    monkeypatch.undo()
    assert [f for f in opened if not f.endswith(".py")] == []
    assert 512 <= again.vocab_size <= 1024
    assert again.model.config.num_hidden_layers == 2
    assert again.tokenizer_digest == first.tokenizer_digest
    assert_same_weights(first, again)


def test_draft_shares_tokenizer_but_not_weights():
    target = models.build_tiny(models.TINY_TARGET)
    draft = models.build_tiny(models.TINY_DRAFT)
    assert draft.tokenizer_digest == target.tokenizer_digest
    assert draft.vocab_size == target.vocab_size
    w_t = target.model.lm_head.weight
    w_d = draft.model.lm_head.weight
    assert not torch.equal(w_t, w_d)


def greedy_agreement(target: TorchBackend, draft: TorchBackend, prompts, steps: int) -> float:
    """Fraction of positions along the target's greedy path where the draft's argmax agrees."""
    agree = total = 0
    for prompt in prompts:
        ct, cd = target.new_cache(), draft.new_cache()
        lt, ld = target.forward(ct, prompt)[-1], draft.forward(cd, prompt)[-1]
        for _ in range(steps):
            x = int(lt.argmax())
            agree += int(ld.argmax()) == x
            total += 1
            lt, ld = target.forward(ct, [x])[-1], draft.forward(cd, [x])[-1]
    return agree / total


def test_tiny_draft_agreement_is_partial():
    target = TorchBackend(models.load(models.TINY_TARGET))
    draft = TorchBackend(models.load(models.TINY_DRAFT))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, target.vocab_size, (6,), generator=g).tolist() for _ in range(6)]
    agreement = greedy_agreement(target, draft, prompts, steps=40)
    assert 0.3 <= agreement <= 0.9, agreement


def test_unknown_model_name_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a built-in name"):
        models.load(str(tmp_path / "no-such-model"))
