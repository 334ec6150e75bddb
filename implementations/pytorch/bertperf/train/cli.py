"""`python -m bertperf train`: flags override the environment (bertperf.config)."""

from __future__ import annotations

import argparse

from bertperf.config import load, process_environment, tunables, yes_no


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="MLPerf BERT pretraining run",
                       description="Every flag has an environment variable (named in its help); "
                                   "a flag wins over its variable.")
    for section, f in tunables():
        switch = {"nargs": "?", "const": "1"} if f.metadata["conv"] is yes_no else {}
        p.add_argument("--" + f.name.replace("_", "-"), dest=f"{section}.{f.name}",
                       default=argparse.SUPPRESS, metavar=f.metadata["env"],
                       help=f"env {f.metadata['env']}", **switch)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertperf.train.loop import main
    flags = {k: v for k, v in vars(args).items() if "." in k}
    return main(load(process_environment(), flags))
