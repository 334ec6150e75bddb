"""Subcommands whose modules are imported only when they run.

A command table maps each name to (module, one-line help). The module either defines
`add_arguments(parser)` and `run(args)` (its docstring becomes the command's description), or is
itself a group with a COMMANDS table of its own (`prep`, `bench`, `model`). Only the module of
the command on the command line is imported, so `python -m bertperf --help`, `prep --help` and
every `prep` stage start without loading what other commands need (PyTorch above all).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Mapping, Sequence

Table = Mapping[str, tuple[str, str]]


def add_commands(parser: argparse.ArgumentParser, table: Table, argv: Sequence[str],
                 dest: str = "command") -> None:
    """Subparsers for `table` on `parser`; only the one named first in `argv` is built fully."""
    chosen = next((a for a in argv if not a.startswith("-")), None)
    sub = parser.add_subparsers(dest=dest, required=True, metavar=dest.upper())
    for name, (module_name, help_text) in table.items():
        if name != chosen:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        rest = list(argv[list(argv).index(name) + 1:])
        if hasattr(module, "COMMANDS"):
            add_commands(p, module.COMMANDS, rest, dest=f"{dest}_{name}".replace("-", "_"))
        else:
            module.add_arguments(p)
            p.set_defaults(func=module.run)
