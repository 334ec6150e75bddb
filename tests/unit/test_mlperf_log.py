"""The MLPerf logger: its lines pass the official compliance checker (ruleset 5.0.0, closed BERT),
with our extra keys too; a log path used again starts a fresh log and keeps the earlier one."""

from __future__ import annotations

import errno
import io
import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mlperf_logging")
from mlperf_logging.mllog import constants as C  # noqa: E402, N812

from bertperf.mlperf.log import RESUMED, Blocks, MLPerfLogger  # noqa: E402
from tests.support.mlperf_logs import checker  # noqa: E402


def write_run(path, accuracy: float, status: str, resumed: bool = False) -> MLPerfLogger:
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
    if resumed:
        log.resumed("ckpt/ckpt_00000100.pt", 100, 44800)
    log.end(C.INIT_STOP)
    log.start(C.RUN_START)
    blocks = Blocks(log)
    blocks.start(44800 if resumed else 0)
    blocks.evaluate(150000, lambda: np.float32(accuracy))
    log.event(C.TRAIN_SAMPLES, 150000)
    log.end(C.RUN_STOP, metadata={C.STATUS: status})
    return log


def events(path) -> list[dict]:
    return [json.loads(l.split(":::MLLOG ", 1)[1]) for l in path.read_text().splitlines()]


def test_log_passes_compliance_checker(tmp_path):
    path = tmp_path / "result_0.txt"
    write_run(path, 0.7215, C.SUCCESS)
    run = checker(path)
    assert "SUCCESS" in run.stderr, run.stderr[-2000:]
    lines = events(path)
    seed = next(l for l in lines if l["key"] == C.SEED)
    assert seed["metadata"]["file"].endswith("test_mlperf_log.py")  # the caller, for the seed check
    assert isinstance(next(l for l in lines if l["key"] == C.EVAL_ACCURACY)["value"], float)


def test_checker_rejects_a_run_below_target(tmp_path):
    """The checker is a real check: the same log with accuracy 0.70 fails."""
    path = tmp_path / "result_0.txt"
    write_run(path, 0.70, C.ABORTED)
    assert "FAILED" in checker(path).stderr


def test_other_ranks_write_nothing(tmp_path):
    log = MLPerfLogger(tmp_path / "r1.txt", rank=1, echo=False)
    log.event(C.SEED, 1)
    assert not (tmp_path / "r1.txt").exists()


def test_unencodable_values_raise(tmp_path):
    log = MLPerfLogger(tmp_path / "x.txt", echo=False)
    with pytest.raises(TypeError):
        log.event(C.SEED, {1, 2})


def test_a_resumed_run_passes_the_checker(tmp_path):
    path = tmp_path / "result_0.txt"
    write_run(path, 0.7215, C.SUCCESS, resumed=True)
    run = checker(path)
    assert "SUCCESS" in run.stderr, run.stderr[-2000:]
    resumed = [e for e in events(path) if e["key"] == RESUMED]
    assert [(e["value"], e["metadata"]["step"], e["metadata"]["samples_count"]) for e in resumed] \
        == [("ckpt/ckpt_00000100.pt", 100, 44800)]
    keys = [e["key"] for e in events(path)]
    assert keys.index("init_start") < keys.index(RESUMED) < keys.index("init_stop")


def test_blocks_open_and_close_around_evals(tmp_path):
    path = tmp_path / "log.txt"
    log = MLPerfLogger(path, echo=False)
    blocks = Blocks(log)
    blocks.start(0)
    blocks.start(0)  # already open: nothing
    assert blocks.evaluate(320, lambda: 0.5) == 0.5
    blocks.stop(320)  # closed by the eval: nothing
    blocks.start(320)
    blocks.stop(480)
    assert [(e["key"], e["metadata"].get("samples_count", e["metadata"].get("epoch_num")))
            for e in events(path)] == [
        ("block_start", 0), ("block_stop", 320), ("eval_start", 320), ("eval_accuracy", 320),
        ("eval_stop", 320), ("block_start", 320), ("block_stop", 480)]


def test_a_second_run_starts_a_fresh_log_and_keeps_the_first(tmp_path):
    """The same path twice: each log holds one run and passes the checker; the earlier one is
    kept under the next free number (.1 taken and .7 taken: .8), never overwritten."""
    path = tmp_path / "result_0.txt"
    assert write_run(path, 0.7215, C.SUCCESS).kept is None
    first = path.read_text()
    second = write_run(path, 0.7301, C.SUCCESS)
    assert second.kept == tmp_path / "result_0.txt.1" and second.kept.read_text() == first
    for log in (path, second.kept):
        assert "SUCCESS" in checker(log).stderr, checker(log).stderr[-2000:]
        assert [e["key"] for e in events(log)].count(C.SUBMISSION_DIVISION) == 1
    (tmp_path / "result_0.txt.7").write_text("an older kept log\n")
    third = write_run(path, 0.7401, C.SUCCESS)
    assert third.kept == tmp_path / "result_0.txt.8"
    assert (tmp_path / "result_0.txt.1").read_text() == first
    assert (tmp_path / "result_0.txt.7").read_text() == "an older kept log\n"


def test_an_empty_log_is_not_kept_and_other_ranks_touch_nothing(tmp_path):
    path = tmp_path / "result_0.txt"
    path.write_text("")
    assert MLPerfLogger(path, echo=False).kept is None
    assert sorted(tmp_path.iterdir()) == [tmp_path / ".result_0.txt.lock", path]
    MLPerfLogger(None, echo=False)  # the newest logger of the process: the lock is released
    path.write_text("a run\n")
    assert MLPerfLogger(path, rank=1, echo=False).kept is None
    assert path.read_text() == "a run\n" and list(tmp_path.iterdir()) == [path]


class FullDisk(io.RawIOBase):
    """A file that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return len(data)


def test_a_failed_write_stops_the_run_with_one_line(tmp_path, capsys):
    """The disk fills under the log: the event that cannot be written raises one UserError
    naming the file and the cause; nothing after it is logged (nor printed by logging)."""
    from bertperf.errors import UserError
    path = tmp_path / "result_0.txt"
    log = MLPerfLogger(path, echo=False)
    log.start(C.INIT_START)
    log._file.stream = io.TextIOWrapper(FullDisk(room=600), write_through=True)
    log.event(C.SEED, 1)  # fits
    with pytest.raises(UserError) as err:
        for _ in range(10):
            log.event(C.SEED, 1)
    assert str(err.value) == (f"MLPerf log {path}: cannot write: no space left on device; "
                              "the run stops")
    log.end(C.RUN_STOP, metadata={C.STATUS: C.ABORTED})  # the way out: nothing, no error
    assert "Logging error" not in capsys.readouterr().err


def test_a_log_another_live_run_writes_is_refused(tmp_path):
    """A second run on the same MLLOG_FILE while the first still writes it: refused in one line
    naming the other process, and the live log is neither renamed nor touched; once that run
    has ended, its log is kept as .1 as usual and the lock is gone."""
    from bertperf.errors import UserError
    path = tmp_path / "result_0.txt"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from bertperf.mlperf.log import MLPerfLogger; "
         f"MLPerfLogger({str(path)!r}, echo=False).event('seed', 1); print('ready', flush=True); "
         "sys.stdin.readline()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "ready\n"
        live = path.read_text()
        with pytest.raises(UserError) as err:
            MLPerfLogger(path, echo=False)
        assert str(err.value).startswith(f"MLPerf log {path} is being written by another run "
                                         f"(pid {holder.pid} on ")
        assert path.read_text() == live and not (tmp_path / "result_0.txt.1").exists()
    finally:
        holder.communicate("\n", timeout=30)
    assert not (tmp_path / ".result_0.txt.lock").exists()
    assert MLPerfLogger(path, echo=False).kept == tmp_path / "result_0.txt.1"


def test_an_exception_raised_mid_write_goes_on_up(tmp_path, capsys, monkeypatch):
    """SIGTERM's handler raises where the main thread is, possibly inside the log's flush: that
    exception reaches the caller, not logging's "--- Logging error ---" printer or the log."""
    path = tmp_path / "result_0.txt"
    log = MLPerfLogger(path, echo=False)

    class Interrupted(Exception):
        pass

    def interrupted():
        raise Interrupted("stopped by SIGTERM")

    monkeypatch.setattr(log._file, "flush", interrupted)
    with pytest.raises(Interrupted):
        log.event(C.SEED, 1)
    assert "Logging error" not in capsys.readouterr().err
    assert "Failed to encode" not in path.read_text()
