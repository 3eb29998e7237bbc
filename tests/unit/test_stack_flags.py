"""`specdec up/demo/load` flags: which pair of services they start."""

from __future__ import annotations

import argparse

from specdec.client_cli import add_stack_flags, stack_config
from specdec.pair import CONTRASTIVE_PAIR, DEFAULT_PAIR


def config(*argv: str):
    p = argparse.ArgumentParser()
    add_stack_flags(p)
    return stack_config(p.parse_args(list(argv)))


def test_the_default_stack_keeps_the_fast_draft():
    pair = config().pair
    assert pair.name == DEFAULT_PAIR.name
    assert "--dynamic-quantization" not in pair.draft.args(0, None)


def test_contrastive_starts_the_amateur_with_dynamic_quantization_off():
    pair = config("--contrastive", "--threads", "2").pair
    assert pair.name == CONTRASTIVE_PAIR.name
    args = pair.draft.args(0, None)
    assert args[args.index("--dynamic-quantization") + 1] == "off"
    assert args[args.index("--threads") + 1] == "2"
    assert pair.target.args(0, None) == config("--threads", "2").pair.target.args(0, None)


def test_draft_args_still_replace_the_defaults():
    pair = config("--contrastive", "--draft-arg=--backend=torch").pair
    assert pair.name == "custom" and "--backend=torch" in pair.draft.args(0, None)
