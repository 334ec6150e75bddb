"""`python -m bertperf prep <stage>`: one subcommand per data-preparation stage.

Each stage module defines HELP, add_arguments(parser) and run(args).
"""

from __future__ import annotations

import argparse
import importlib

STAGES = {
    "dictd": "bertperf.prep.text.dictd",
    "clean": "bertperf.prep.text.clean",
    "segment": "bertperf.prep.text.segment",
    "split": "bertperf.prep.text.split",
    "create": "bertperf.prep.samples.create",
    "eval": "bertperf.prep.samples.pick_eval",
    "verify": "bertperf.prep.verify",
    "unpad": "bertperf.prep.shards.unpad",
    "chop": "bertperf.prep.shards.chop",
    "pack": "bertperf.prep.shards.pack",
    "stratify": "bertperf.prep.shards.stratify",
    "stats": "bertperf.prep.shards.stats",
}


def add_prep_parser(sub: argparse._SubParsersAction) -> None:
    prep = sub.add_parser("prep", help="data preparation stages (Wikipedia text to HDF5 samples)")
    stages = prep.add_subparsers(dest="stage", required=True)
    for name, module_name in STAGES.items():
        module = importlib.import_module(module_name)
        p = stages.add_parser(name, help=module.HELP, description=module.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
