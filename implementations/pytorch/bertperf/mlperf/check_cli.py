"""`python -m bertperf check` and `python -m bertperf submission`: the official MLPerf checkers
(training ruleset 5.0.0) on logs, a results folder or a submission, and the assembly of a
submission folder from a run directory."""

from __future__ import annotations

import argparse
import sys

CHECK_HELP = "run the official MLPerf checkers (ruleset 5.0.0) and print one verdict table"
CHECK_DESCRIPTION = """\
Runs the official tools of mlperf-logging (training ruleset 5.0.0, BERT's last) and prints one
table: check, target, verdict (PASS, BYPASS, WARN, FAIL), detail. Exit status 1 if any check FAILs.

  --logs LOG...        compliance_checker on each log (a folder: its result_*.txt)
  --results DIR...     rcp_checker on a results/<system>/bert folder (or results/<system>)
  --submission DIR...  a submitter folder (<Org>/ with systems/ and results/), or a folder of them:
                       system_desc_checker on each systems/*.json, compliance_checker on each
                       results/*/bert/result_*.txt, package_checker, result_summarizer (the score)

The verdict is read from each tool's text output (their exit status is 0 on failure for the
package and system-description checkers); see compliance/README.md for what is parsed.
The package checker and the summarizer write results/<system>/bert/scaling.json when the RCP check
says the score must be normalised (MLPerf's own behaviour; the file belongs to the submission)."""

SUBMISSION_HELP = "assemble an MLPerf submission folder (<OUT>/<Org>/...) from a run directory"
SUBMISSION_DESCRIPTION = """\
Builds <OUT>/<ORG>/ for training ruleset 5.0.0, closed BERT:
  systems/<SYSTEM>.json                        from this machine (CPU, memory, GPUs, software) and flags
  benchmarks/bert/implementations/pytorch/     a copy of this implementation (no .pyc/.so)
  results/<SYSTEM>/bert/result_0..9.txt        the run directory's result logs, each checked first
  results/<SYSTEM>/bert/package_checker_params only with --rcp-bypass ("rcp-bypass", no newline)
Run it on (a node of) the system that made the runs: the system description is read from the
machine it runs on. It is built in a hidden folder inside OUT and renamed into place at the end.
Then: python -m bertperf check --submission OUT/ORG"""


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help=CHECK_HELP, description=CHECK_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
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


def add_submission_parser(sub: argparse._SubParsersAction) -> None:
    from bertperf.mlperf.submission import STATUSES

    p = sub.add_parser("submission", help=SUBMISSION_HELP, description=SUBMISSION_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, metavar="DIR",
                   help="folder holding the 10 result logs (searched recursively, see --pattern)")
    p.add_argument("--org", required=True, help="submitting organisation (folder name, submitter)")
    p.add_argument("--system", required=True,
                   help="system description id: systems/<SYSTEM>.json and results/<SYSTEM>/")
    p.add_argument("--out", required=True, metavar="OUT", help="folder to create <ORG>/ in")
    p.add_argument("--config-file", nargs="+", default=[], metavar="FILE",
                   help="config_*.sh files to add to the implementation folder (besides those "
                        "found in the repository)")
    p.add_argument("--pattern", default="result_*.txt",
                   help="file name pattern of the result logs under --run-dir (default %(default)s)")
    p.add_argument("--status", choices=sorted(STATUSES), default="research",
                   help="system availability: " + "; ".join(f"{k} = {v!r}"
                                                          for k, v in sorted(STATUSES.items()))
                        + " (default %(default)s)")
    p.add_argument("--division", choices=["closed", "open"], default="closed",
                   help="must match the logs' submission_division (default %(default)s)")
    p.add_argument("--nodes", type=int, default=1, help="number_of_nodes (default %(default)s)")
    p.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                   help="set a system-description field the machine cannot tell, e.g. "
                        "--field cooling=air --field host_storage_type=NVMe (repeatable)")
    p.add_argument("--rcp-bypass", action="store_true",
                   help="write results/<SYSTEM>/bert/package_checker_params = 'rcp-bypass'")
    p.add_argument("--allow-one-failed-run", action="store_true",
                   help="accept one log that fails the compliance checker (MLPerf's olympic "
                        "scoring drops it); by default any failing log is refused")
    p.add_argument("--force", action="store_true",
                   help="replace an existing <OUT>/<ORG>/results/<SYSTEM>/bert")
    p.set_defaults(func=run_submission)


def run_submission(args: argparse.Namespace) -> int:
    from bertperf.mlperf.submission import assemble, parse_fields

    report = assemble(run_dir=args.run_dir, org=args.org, system=args.system, out=args.out,
                      config_files=args.config_file, pattern=args.pattern, status=args.status,
                      division=args.division, nodes=args.nodes, fields=parse_fields(args.field),
                      rcp_bypass=args.rcp_bypass, allow_one_failed=args.allow_one_failed_run,
                      force=args.force)
    for line in report:
        print(line)
    return 0
