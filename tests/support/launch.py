"""The CPU job as the launch tests run it (test_launch.py, test_multinode.py, the container
tests): config_CPU_1x2x32x1.sh's variables with its data and length swapped for the copy task
(copy_task.py: global batch 16 on 2 ranks, MLPerf's 0.720 within a few hundred steps), so a run
takes seconds, or CAPPED at 40 steps; and the check a finished run's log must pass (the
compliance checker, its status, the global batch)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.copy_task import add_manifests, make_dataset
from tests.support.mlperf_logs import checker, events
from tests.support.scripts import CONFIG, LAUNCH_VARS, config_env


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """The copy task (512 training samples) with its manifests, as the prep stages write them."""
    return add_manifests(make_dataset(tmp_path_factory.mktemp("launch") / "data", n_train=512))


def job_env(data: dict, logdir: Path, **extra: str) -> dict:
    """config_CPU's variables, the copy task instead of the demo corpus, this Python."""
    base = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    return {**base, **config_env(CONFIG), **data, "PYTHON": sys.executable, "LOGDIR": str(logdir),
            "BATCHSIZE": "8", "LR": "0.02", "MAX_STEPS": "300", "WARMUP_STEPS": "0",
            "EVAL_ITER_START_SAMPLES": "320", "EVAL_ITER_SAMPLES": "320",
            "MAX_SAMPLES_TERMINATION": "20000", "TARGET_MLM_ACCURACY": "0.72",
            "EVAL_BATCHSIZE": "64", "LOG_FREQ": "20", "SEED": "0", "DIST_TIMEOUT": "60",
            **extra}


CAPPED = {"MAX_SAMPLES_TERMINATION": "640"}
"""A job stopped after 40 steps of global batch 16 (two evals), before the target: its log ends
aborted, which the open division's checker accepts, and run_and_time.sh prints its RESULT line.
For the tests of how ranks start, stop and resume, which a run to the target (about 160 steps)
adds nothing to; the submission's runs (tests/e2e/test_submission.py) and the container's reach
it."""


def mllog_values(log: Path) -> dict:
    """A log's eval accuracies, run_stop statuses and global batch sizes."""
    ev = events(log)
    return {"acc": [e["value"] for e in ev if e["key"] == "eval_accuracy"],
            "status": [e["metadata"]["status"] for e in ev if e["key"] == "run_stop"],
            "gbs": [e["value"] for e in ev if e["key"] == "global_batch_size"]}


def assert_compliant(log: Path, status: str = "success") -> dict:
    """The log passes the compliance checker, its run ended with `status` (aborted: CAPPED) at
    global batch 16: its values."""
    check = checker(log)
    assert "SUCCESS" in check.stderr, check.stderr[-3000:]
    values = mllog_values(log)
    assert values["status"] == [status] and values["gbs"] == [16], values
    return values
