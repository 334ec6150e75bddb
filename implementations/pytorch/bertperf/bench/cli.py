"""`python -m bertperf bench <name>`."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {"prep": "bertperf.bench.prep", "loader": "bertperf.bench.loader",
           "attention": "bertperf.bench.attention"}


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (print a table)")
    names = bench.add_subparsers(dest="bench", required=True)
    for name, module_name in BENCHES.items():
        module = importlib.import_module(module_name)
        p = names.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
