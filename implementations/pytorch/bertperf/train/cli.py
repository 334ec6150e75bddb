"""`python -m bertperf train`: one MLPerf BERT pretraining run.

Every setting comes from an environment variable (the names of NVIDIA's config_*.sh files; the
typed fields of bertperf/config.py) and has a flag that wins over its variable."""

from __future__ import annotations

import argparse

from bertperf.config import load, process_environment, tunables, yes_no


def add_arguments(p: argparse.ArgumentParser) -> None:
    for section, f in tunables():
        switch = {"nargs": "?", "const": "1"} if f.metadata["conv"] is yes_no else {}
        p.add_argument("--" + f.name.replace("_", "-"), dest=f"{section}.{f.name}",
                       default=argparse.SUPPRESS, metavar=f.metadata["env"],
                       help=f"env {f.metadata['env']}", **switch)
    p.add_argument("--check", action="store_true",
                   help="only load and validate the configuration (variables, paths, global "
                        "batch against the RCP range) and print it; run.sub does this first")


def run(args: argparse.Namespace) -> int:
    flags = {k: v for k, v in vars(args).items() if "." in k}
    cfg = load(process_environment(), flags)
    from bertperf.train.checks import check_run
    check_run(cfg)
    if args.check:
        print(f"train --check: OK: global batch {cfg.global_batch_size} "
              f"({cfg.dist.world_size} ranks x {cfg.train.batch_size} x "
              f"{cfg.train.gradient_steps}), LR {cfg.optim.lr}, MAX_STEPS {cfg.optim.max_steps}, "
              f"first eval at {cfg.first_eval} samples then every {cfg.eval_interval}, "
              f"data {cfg.data.train_dir}, eval {cfg.data.eval_file}")
        return 0
    from bertperf.train.loop import main
    return main(cfg)
