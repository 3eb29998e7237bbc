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


def test_a_service_spec_is_model_service_settings_and_its_command_line_parses_back():
    """One description of how a model service runs: a ServiceSpec's settings are
    ModelServiceConfig fields of the same names, and its command line, parsed by the
    service's own parser, gives back exactly those values."""
    from dataclasses import fields

    from draft_service.config import from_args as draft_from_args
    from specdec.pair import CANDIDATES, ServiceSpec
    from specdec.service_config import ModelServiceConfig, command_line
    from target_service.config import from_args as target_from_args

    settings = {f.name for f in fields(ServiceSpec)} - {"role", "extra"}
    assert settings <= {f.name for f in fields(ModelServiceConfig)}
    parse = {"draft": draft_from_args, "target": target_from_args}
    for pair in [DEFAULT_PAIR, CONTRASTIVE_PAIR, *CANDIDATES]:
        for spec in (pair.target, pair.draft):
            cfg = parse[spec.role](spec.args(5005, 1))
            assert (cfg.port, cfg.cpus) == (5005, "1")
            for name in settings:
                if getattr(spec, name) not in (None, 0):
                    assert getattr(cfg, name) == getattr(spec, name), (spec, name)
    assert command_line({"warmup": False, "threads": 2}) == ["--no-warmup", "--threads", "2"]
    try:
        command_line({"no_such_setting": 1})
    except ValueError as e:
        assert "no_such_setting" in str(e)
    else:
        raise AssertionError("an unknown setting was spelled")
