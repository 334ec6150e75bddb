"""`python -m bertperf train`: one MLPerf BERT pretraining run.

Every setting comes from an environment variable (the names of NVIDIA's config_*.sh files; the
typed fields of bertperf/config.py) and has a flag that wins over its variable."""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from dataclasses import MISSING, fields

from bertperf import config
from bertperf.config import RunConfig, load, process_environment, tunables, yes_no


def field_docs() -> dict[tuple[str, str], str]:
    """{(class, field): the docstring under the field} for every class of bertperf/config.py, read
    from its source, whitespace folded."""
    docs = {}
    for cls in ast.parse(inspect.getsource(config)).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node, doc in zip(cls.body, cls.body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and \
                    isinstance(doc.value.value, str):
                docs[cls.name, node.target.id] = " ".join(doc.value.value.split())
    return docs


def default_text(value) -> str | None:
    """A field's default as its variable would be written (None: no default to show)."""
    if value is None or value is MISSING:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "%(prog)s [-h] [--check] [--SETTING VALUE ...]"
    docs = field_docs()
    classes = {f.name: f.default_factory.__name__ for f in fields(RunConfig)}
    groups = {section: p.add_argument_group(f"{section} settings", docs["RunConfig", section])
              for section in dict.fromkeys(section for section, _ in tunables())}
    for section, f in tunables():
        env, doc = f.metadata["env"], docs.get((classes[section], f.name), "")
        default = default_text(f.default)
        where = f"env {env}" + (f"; default {default}" if default is not None else "")
        switch = {"nargs": "?", "const": "1"} if f.metadata["conv"] is yes_no else {}
        groups[section].add_argument(
            "--" + f.name.replace("_", "-"), dest=f"{section}.{f.name}",
            default=argparse.SUPPRESS, metavar=env,
            help=f"{doc} ({where})".strip().replace("%", "%%"), **switch)
    p.add_argument("--check", action="store_true",
                   help="only load and validate the configuration (variables, paths, global "
                        "batch against the RCP range) and print it; run.sub does this first")


def run(args: argparse.Namespace) -> int:
    flags = {k: v for k, v in vars(args).items() if "." in k}
    cfg = load(process_environment(), flags)
    from bertperf.train.checks import check_device, check_run, resolve_layout, run_warnings
    from bertperf.train.launch import reported_to_launcher
    with reported_to_launcher(under_launcher=cfg.dist.launcher_store):
        cfg = resolve_layout(cfg)
        check_run(cfg)
        check_device(cfg)
        if cfg.dist.rank == 0:
            for line in run_warnings(cfg):
                print(f"warning: {line}", file=sys.stderr, flush=True)
        if args.check:
            rows = f" ({cfg.rows_per_step} rows x {cfg.data.packing_factor})" \
                if cfg.data.layout == "packed" else ""
            print(f"train --check: OK: global batch {cfg.global_batch_size} "
                  f"({cfg.dist.world_size} ranks x {cfg.train.batch_size} x "
                  f"{cfg.train.gradient_steps}){rows}, layout {cfg.data.layout}, LR "
                  f"{cfg.optim.lr}, MAX_STEPS "
                  f"{cfg.optim.max_steps}, first eval at {cfg.first_eval} samples then every "
                  f"{cfg.eval_interval}, data {cfg.data.train_dir}, eval {cfg.data.eval_file}")
            return 0
        from bertperf.train.loop import main
        return main(cfg)
