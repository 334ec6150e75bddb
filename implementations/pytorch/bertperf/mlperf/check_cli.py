"""`python -m bertperf check`: the official MLPerf checkers of mlperf-logging (training ruleset
5.0.0, BERT's last) on logs, a results folder or a submission, and one table: check, target,
verdict (PASS, BYPASS, WARN, FAIL), detail. Exit status 1 if any check FAILs.

  --logs LOG...        compliance_checker on each log (a folder: its result_*.txt)
  --results DIR...     rcp_checker on a results/<system>/bert folder (or results/<system>)
  --submission DIR...  a submitter folder (<Org>/ with systems/ and results/), or a folder of them:
                       system_desc_checker on each systems/*.json, compliance_checker on each
                       results/*/bert/result_*.txt, package_checker, result_summarizer (the score)

Verdicts come from each tool's text (compliance/README.md says what is read). The package checker
and the summarizer write results/<system>/bert/scaling.json when the score must be normalised."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--logs", nargs="+", default=[], metavar="LOG",
                   help="MLPerf result logs (or folders of result_*.txt) for the compliance checker")
    p.add_argument("--results", nargs="+", default=[], metavar="DIR",
                   help="results/<system>/bert folders for the RCP checker")
    p.add_argument("--submission", nargs="+", default=[], metavar="DIR",
                   help="submitter folders (<Org>/) or folders holding them")
    p.add_argument("--rcp-bypass", action="store_true",
                   help="let RCP failures of the bypassable kinds through (package checker's "
                        "--rcp-bypass); they show as BYPASS. Legitimate only as compliance/README.md "
                        "says")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="checker processes at once (default: min(4, CPUs))")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="after the table, print the full output of every check that is not PASS")


def run(args: argparse.Namespace) -> int:
    from bertperf.mlperf.check import PASS, format_table, run_checks, summary_lines

    results = run_checks(args.logs, args.results, args.submission, args.rcp_bypass, args.jobs)
    print(format_table(results))
    print()
    for line in summary_lines(results, args.rcp_bypass):
        print(line)
    if args.verbose:
        for r in results:
            if r.verdict != PASS:
                print(f"\n===== {r.check} {r.target}: {r.verdict}, {r.seconds:.2f} s =====\n"
                      f"{r.output.rstrip()}")
    sys.stdout.flush()
    return 1 if any(r.verdict == "FAIL" for r in results) else 0
