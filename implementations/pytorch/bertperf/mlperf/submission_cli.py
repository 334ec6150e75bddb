"""`python -m bertperf submission`: assemble an MLPerf submission folder from a run directory.

Builds <OUT>/<ORG>/ for training ruleset 5.0.0, closed BERT:
  systems/<SYSTEM>.json                        from this machine (CPU, memory, GPUs, software) and flags
  benchmarks/bert/implementations/pytorch/     a copy of this implementation (no .pyc/.so)
  results/<SYSTEM>/bert/result_0..9.txt        the run directory's result logs, each checked first
  results/<SYSTEM>/bert/package_checker_params only with --rcp-bypass ("rcp-bypass", no newline)
Run it on (a node of) the system that made the runs: the system description is read from the
machine it runs on. It is built in a hidden folder inside OUT and renamed into place at the end.
Then: python -m bertperf check --submission OUT/ORG"""

from __future__ import annotations

import argparse

from bertperf.benchmark import CLOSED, DIVISIONS


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bertperf.mlperf.submission import STATUSES

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
    p.add_argument("--division", choices=DIVISIONS, default=CLOSED,
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


def run(args: argparse.Namespace) -> int:
    from bertperf.mlperf.submission import assemble, parse_fields

    report = assemble(run_dir=args.run_dir, org=args.org, system=args.system, out=args.out,
                      config_files=args.config_file, pattern=args.pattern, status=args.status,
                      division=args.division, nodes=args.nodes, fields=parse_fields(args.field),
                      rcp_bypass=args.rcp_bypass, allow_one_failed=args.allow_one_failed_run,
                      force=args.force)
    for line in report:
        print(line)
    return 0
