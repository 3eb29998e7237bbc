"""The `specdec` command: the library's commands (prepare, certs, generate, up), and the
tooling's (the demo, benchmarks, the soak, scale-out, tuning) where that is installed."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# The tooling registers its commands through this module's add_parsers(sub). It is found
# by name, not imported: the library never depends on its tooling, and a service image,
# which installs no tooling, has the library's commands only.
TOOLING_COMMANDS = "specdec_tools.commands"


def tooling_commands():
    """The tooling's add_parsers, or None where the tooling is not installed."""
    try:
        return importlib.import_module(TOOLING_COMMANDS).add_parsers
    except ModuleNotFoundError as e:
        if e.name not in ("specdec_tools", TOOLING_COMMANDS):
            raise  # the tooling is there and broken: say so
        return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdec", description="distributed speculative decoding")
    sub = p.add_subparsers(dest="command", required=True)

    from specdec.certs import add_parser as add_certs
    from specdec.client_cli import add_parsers
    from specdec.model_pairs import add_pair_flags
    from specdec.prepare import add_prepare_parser

    add_pair_flags(add_prepare_parser(sub))  # the real pairs: --pair, --only, --wheels
    add_parsers(sub)
    add_certs(sub)
    add_tooling = tooling_commands()
    if add_tooling is not None:
        add_tooling(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
