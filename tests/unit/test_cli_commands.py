"""The `specdec` command: the library's commands always, the tooling's where it is
installed (a service image has no specdec_tools)."""

from __future__ import annotations

import sys

import pytest

LIBRARY = {"prepare", "generate", "up", "certs"}


def commands() -> set[str]:
    from specdec.cli import parser

    return set(parser()._subparsers._group_actions[0].choices)


def test_with_the_tooling_every_command_is_there():
    got = commands()
    assert LIBRARY <= got
    assert {"demo", "bench", "load", "soak", "rpc-bench", "bench-scale", "tune-skip"} <= got


def test_without_the_tooling_the_library_s_commands_remain(monkeypatch):
    monkeypatch.setitem(sys.modules, "specdec_tools", None)  # as in an image
    monkeypatch.delitem(sys.modules, "specdec_tools.commands", raising=False)
    assert commands() == LIBRARY


def test_a_broken_tooling_is_not_taken_for_a_missing_one(monkeypatch):
    """The tooling is there but one of its own imports fails: say so, do not hide it."""
    from specdec import cli

    def broken(name):
        raise ModuleNotFoundError("No module named 'optuna'", name="optuna")

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="optuna"):
        cli.parser()
