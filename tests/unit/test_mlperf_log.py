"""The MLPerf logger: its lines pass the official compliance checker (ruleset 5.0.0, closed BERT)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mlperf_logging")
from mlperf_logging.mllog import constants as C  # noqa: E402, N812

from bertperf.benchmark import RULESET  # noqa: E402
from bertperf.mlperf.log import MLPerfLogger  # noqa: E402


def write_run(path, accuracy: float, status: str) -> None:
    log = MLPerfLogger(path, rank=0, echo=False)
    log.event(C.CACHE_CLEAR, True)
    log.start(C.INIT_START)
    log.submission("bertperf", "test-cpu")
    log.event(C.SEED, 1234)
    log.hyperparameters({
        C.GLOBAL_BATCH_SIZE: 448, C.GRADIENT_ACCUMULATION_STEPS: 1, C.MAX_SEQUENCE_LENGTH: 512,
        C.OPT_NAME: C.LAMB, C.OPT_BASE_LR: 4.25e-4, C.OPT_LAMB_EPSILON: 1e-6,
        C.OPT_LR_TRAINING_STEPS: 6700, C.OPT_LR_WARMUP_STEPS: 0, C.NUM_WARMUP_STEPS: 0,
        C.START_WARMUP_STEP: 0, C.OPT_LAMB_BETA_1: 0.9, C.OPT_LAMB_BETA_2: 0.999,
        C.OPT_LAMB_WEIGHT_DECAY: 0.01, C.EVAL_SAMPLES: 10000})
    log.end(C.INIT_STOP)
    log.start(C.RUN_START)
    log.start(C.BLOCK_START, metadata={C.FIRST_EPOCH_NUM: 0, C.EPOCH_COUNT: 1, "samples_count": 0})
    log.event(C.EVAL_ACCURACY, np.float32(accuracy), metadata={C.EPOCH_NUM: 150000})
    log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: 0, "samples_count": 150000})
    log.event(C.TRAIN_SAMPLES, 150000)
    log.end(C.RUN_STOP, metadata={C.STATUS: status})


def check(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage",
                           "training", "--ruleset", RULESET, "--log_output",
                           str(path) + ".checker", str(path)], capture_output=True, text=True)


def test_log_passes_compliance_checker(tmp_path):
    path = tmp_path / "result_0.txt"
    write_run(path, 0.7215, C.SUCCESS)
    run = check(path)
    assert "SUCCESS" in run.stderr, run.stderr[-2000:]
    lines = [json.loads(l.split(":::MLLOG ", 1)[1]) for l in path.read_text().splitlines()]
    seed = next(l for l in lines if l["key"] == C.SEED)
    assert seed["metadata"]["file"].endswith("test_mlperf_log.py")  # the caller, for the seed check
    assert isinstance(next(l for l in lines if l["key"] == C.EVAL_ACCURACY)["value"], float)


def test_checker_rejects_a_run_below_target(tmp_path):
    """The checker is a real check: the same log with accuracy 0.70 fails."""
    path = tmp_path / "result_0.txt"
    write_run(path, 0.70, C.ABORTED)
    assert "FAILED" in check(path).stderr


def test_other_ranks_write_nothing(tmp_path):
    log = MLPerfLogger(tmp_path / "r1.txt", rank=1, echo=False)
    log.event(C.SEED, 1)
    assert not (tmp_path / "r1.txt").exists()


def test_unencodable_values_raise(tmp_path):
    log = MLPerfLogger(tmp_path / "x.txt", echo=False)
    with pytest.raises(TypeError):
        log.event(C.SEED, {1, 2})
