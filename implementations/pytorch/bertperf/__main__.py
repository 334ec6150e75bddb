"""`python -m bertperf <subcommand>`: the single entry point of the harness."""

from __future__ import annotations

import argparse
import sys

from bertperf.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    from bertperf.bench.cli import add_bench_parser
    from bertperf.mlperf.check_cli import add_check_parser, add_submission_parser
    from bertperf.mlperf.plot import add_plot_parser
    from bertperf.model.convert_cli import add_convert_parser
    from bertperf.prep.cli import add_prep_parser
    from bertperf.train.cli import add_train_parser

    parser = argparse.ArgumentParser(prog="python -m bertperf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_prep_parser(sub)
    add_bench_parser(sub)
    add_train_parser(sub)
    add_plot_parser(sub)
    add_convert_parser(sub)
    add_check_parser(sub)
    add_submission_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"bertperf: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # unwritable folder, missing file, full disk: the message names the path
        print(f"bertperf: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bertperf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
