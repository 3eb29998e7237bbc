"""--dynamic-quantization: auto, off, or the group size the CPU plugin quantizes
activations in; anything else is refused at parse time with what is accepted."""

from __future__ import annotations

import pytest

from specdec.service_config import quantization_group
from target_service.config import from_args


@pytest.mark.parametrize(("value", "group"), [("auto", 0), ("off", 0), ("32", 32),
                                              ("128", 128), ("1536", 1536)])
def test_accepted_values_and_the_group_they_name(value, group):
    cfg = from_args(["--model", "tiny-random", "--dynamic-quantization", value])
    assert cfg.dynamic_quantization == value
    assert quantization_group(cfg.dynamic_quantization) == group


@pytest.mark.parametrize("value", ["0", "100", "-32", "on", "128.0", ""])
def test_other_values_are_refused_with_what_is_accepted(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        from_args(["--model", "tiny-random", "--dynamic-quantization", value])
    assert exit_.value.code == 2
    assert "positive multiple of 32" in capsys.readouterr().err
