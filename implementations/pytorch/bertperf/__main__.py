"""`python -m bertperf <command>`: the single entry point of the harness."""

from __future__ import annotations

import argparse
import sys

from bertperf.commands import add_commands
from bertperf.errors import UserError
from bertperf.formats.files import os_error_line

COMMANDS = {
    "prep": ("bertperf.prep.cli",
             "data preparation stages (Wikipedia text to training shards)"),
    "train": ("bertperf.train.cli", "MLPerf BERT pretraining run"),
    "launch": ("bertperf.train.launch",
               "start this node's ranks of `train` (torch.distributed's launcher); one line "
               "naming the rank that failed first"),
    "rank": ("bertperf.train.rank",
             "this process's rank, world size and local rank, as the trainer reads them"),
    "convert-ckpt": ("bertperf.model.convert_cli",
                     "TF1 BERT checkpoint -> PyTorch .pt (no TensorFlow)"),
    "export": ("bertperf.train.export",
               "a run's checkpoint -> a HuggingFace model folder (config.json, safetensors, "
               "tokenizer, model card)"),
    "plot": ("bertperf.mlperf.plot", "PNG of loss and accuracy curves from an MLPerf log"),
    "check": ("bertperf.mlperf.check_cli",
              "run the official MLPerf checkers (ruleset 5.0.0) and print one verdict table"),
    "submission": ("bertperf.mlperf.submission_cli",
                   "assemble an MLPerf submission folder (<OUT>/<Org>/...) from a run directory"),
    "bench": ("bertperf.bench.cli", "benchmarks (each prints a table)"),
    "plan": ("bertperf.perfmodel.plan",
             "a cluster's MLPerf BERT configurations with their predicted time to train (a model), "
             "the fastest closed and open marked; --write writes them as config files"),
    "model": ("bertperf.perfmodel.cli",
              "a performance model (a prediction, not a measurement): the step on an A100 and an "
              "H100, DGX A100 and commodity clusters, layerwise training"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser for `argv`: only the named command's module is imported (bertperf.commands)."""
    parser = argparse.ArgumentParser(prog="python -m bertperf", description=__doc__)
    add_commands(parser, COMMANDS, argv)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"bertperf: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # unwritable folder, missing file, full disk: the message names the path
        print(f"bertperf: error: {os_error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bertperf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
