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
    p.add_argument("--check", action="store_true",
                   help="only load and validate the configuration (variables, paths, global "
                        "batch against the RCP range) and print it; run.sub does this first")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    flags = {k: v for k, v in vars(args).items() if "." in k}
    cfg = load(process_environment(), flags)
    if args.check:
        print(f"train --check: OK: global batch {cfg.global_batch_size} "
              f"({cfg.dist.world_size} ranks x {cfg.train.batch_size} x "
              f"{cfg.train.gradient_steps}), LR {cfg.optim.lr}, MAX_STEPS {cfg.optim.max_steps}, "
              f"first eval at {cfg.first_eval} samples then every {cfg.eval_interval}, "
              f"data {cfg.data.train_dir}, eval {cfg.data.eval_file}")
        return 0
    from bertperf.train.loop import main
    return main(cfg)
