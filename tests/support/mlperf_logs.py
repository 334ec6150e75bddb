"""Reading an MLPerf log a run wrote: its events (the JSON of every `:::MLLOG` line, other lines
passed over) and the official compliance checker run on it (ruleset 5.0.0: SUCCESS in its stderr
when the log passes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bertperf.benchmark import RULESET


def events(log: Path) -> list[dict]:
    return [json.loads(l.split(":::MLLOG ", 1)[1]) for l in log.read_text().splitlines()
            if ":::MLLOG " in l]


def checker(log: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage",
                           "training", "--ruleset", RULESET, "--log_output",
                           str(log) + ".checker", str(log)], capture_output=True, text=True)
