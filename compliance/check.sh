#!/usr/bin/env bash
# Run the official MLPerf checkers (mlperf-logging, training ruleset 5.0.0) and print one verdict
# table: a thin wrapper around `python -m bertperf check` (see compliance/README.md).
#
#   compliance/check.sh --logs LOG... | --results DIR... | --submission DIR... [--rcp-bypass]
#
# PYTHON picks the interpreter (default python3). If it cannot import bertperf (not installed),
# this checkout's implementations/pytorch is put on PYTHONPATH. Exit status: 1 if a check FAILs.
set -euo pipefail

python="${PYTHON:-python3}"
if ! "$python" -c 'import bertperf' >/dev/null 2>&1; then
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  export PYTHONPATH="$repo/implementations/pytorch${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$python" -m bertperf check "$@"
