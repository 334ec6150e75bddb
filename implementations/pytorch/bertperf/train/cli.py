"""`python -m bertperf train`: one MLPerf BERT pretraining run.

Every setting comes from an environment variable (the names of NVIDIA's config_*.sh files; the
typed fields of bertperf/config.py) and has a flag that wins over its variable."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import fields

from bertperf.config import (RunConfig, default_text, doc, environment_warnings, load,
                             process_environment, tunables, yes_no)
from bertperf.errors import PREEMPTION_SIGNAL, UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "%(prog)s [-h] [--check] [--SETTING VALUE ...]"
    sections = {f.name: f for f in fields(RunConfig)}
    groups = {section: p.add_argument_group(f"{section} settings", doc(sections[section]))
              for section in dict.fromkeys(section for section, _ in tunables())}
    for section, f in tunables():
        env, text = f.metadata["env"], doc(f)
        default = default_text(f.default)
        where = f"env {env}" + (f"; default {default}" if default is not None else "")
        switch = {"nargs": "?", "const": "1"} if f.metadata["conv"] is yes_no else {}
        groups[section].add_argument(
            "--" + f.name.replace("_", "-"), dest=f"{section}.{f.name}",
            default=argparse.SUPPRESS, metavar=env,
            help=f"{text} ({where})".strip().replace("%", "%%"), **switch)
    p.add_argument("--check", action="store_true",
                   help="only load and validate the configuration (variables, paths, global "
                        "batch against the RCP range) and print it; run.sub does this first")


def warn(lines: list[str]) -> None:
    """Each line on stderr as a warning."""
    for line in lines:
        print(f"warning: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    # the preemption warning, until the trainer takes it (dist.failures_as_errors): one during
    # start-up is dropped, where SIGUSR1's default would end the process
    signal.signal(PREEMPTION_SIGNAL, signal.SIG_IGN)
    flags = {k: v for k, v in vars(args).items() if "." in k}
    environ = process_environment()
    hints = environment_warnings(environ, flags)
    try:
        cfg = load(environ, flags)
    except UserError:
        warn(hints)  # every rank stops here, and a misspelt variable may be why
        raise
    if cfg.dist.rank == 0:
        warn(hints)
    from bertperf.train.launch import reported_to_launcher
    with reported_to_launcher(under_launcher=cfg.dist.launcher_store):
        if not args.check:
            from bertperf.train.loop import main
            return main(cfg)
        from bertperf.train.checks import prepare, run_warnings
        from bertperf.train.layout import layout_of
        from bertperf.train.parallel import reduction_for
        cfg = prepare(cfg)
        if cfg.dist.rank == 0:
            warn(run_warnings(cfg))
        layout = layout_of(cfg)
        gbs = layout.global_batch_size(cfg)
        rows = f" ({cfg.rows_per_step} rows x {cfg.data.packing_factor})" \
            if layout.fixed_shapes else ""
        print(f"train --check: OK: global batch {gbs} ({cfg.dist.world_size} ranks x "
              f"{cfg.train.batch_size} x {cfg.train.gradient_steps}){rows}, layout {layout.name}, "
              f"gradients {reduction_for(cfg, cfg.dist.world_size).name}, LR {cfg.optim.lr}, "
              f"MAX_STEPS {cfg.optim.max_steps}, first eval at {cfg.first_eval(gbs)} samples "
              f"then every {cfg.eval_interval(gbs)}, data {cfg.data.train_dir}, eval "
              f"{cfg.data.eval_file}")
        return 0
