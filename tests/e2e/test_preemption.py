"""Jobs that outlive their processes, on a real two-rank job under `bertperf launch`. A rank
killed (--max-restarts): every rank starts again from the newest checkpoint, or the start; killed
again before a newer checkpoint: the job stops with one line. The preemption warning (SIGUSR1:
what Slurm's --signal sends before a job's time limit or its preemption): the launcher forwards
it to its ranks, they agree on a step, write one checkpoint there, end the MLPerf log aborted
with the reason, and the job exits 75. RESUME_FROM=auto then finishes it on the uninterrupted
job's loss curve (rtol 1e-5), to the same model, and the logs pass the compliance checker (open
division: a closed-division log of a run stopped before its target fails the target's check)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertperf.train.checkpoint import file_name, newest_first
from tests.support.copy_task import add_manifests, make_dataset
from tests.support.mlperf_logs import checker
from tests.e2e.test_train_faults import rank_pids
from tests.support.runs import LAUNCH_TIMEOUT, base_env, launch, reaped
from tests.support.tensorboard import curves

pytestmark = pytest.mark.slow

LAUNCH = [sys.executable, "-m", "bertperf", "launch", "--nproc-per-node", "2", "train"]
STEPS, EVERY = "32", "4"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    return add_manifests(make_dataset(tmp_path_factory.mktemp("preempt") / "data", n_train=256))


def events(log: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()
            if ":::MLLOG " in line] if log.exists() else []


def losses(log: Path) -> dict[int, float]:
    """{step: the ranks' mean loss} of the log's train_loss events (LOG_FREQ=1)."""
    return {e["metadata"]["step"]: e["value"] for e in events(log) if e["key"] == "train_loss"}


def model(folder: Path) -> dict[str, torch.Tensor]:
    """The model part of the newest checkpoint in `folder`."""
    return torch.load(newest_first(folder)[0], weights_only=True)["model"]


ENV = {"MAX_STEPS": STEPS, "PREEMPT_CHECK_EVERY": EVERY, "EVAL_ITER_SAMPLES": "160",
       "CHECKPOINT_EVERY": "16", "SUBMISSION_DIVISION": "open"}  # 32 steps: not the target


@pytest.fixture(scope="module")
def whole(data, tmp_path_factory) -> Path:
    """The uninterrupted job's folder (its log result_0.txt, its checkpoints in ckpt/)."""
    out = tmp_path_factory.mktemp("whole")
    [(status, text)] = launch([(LAUNCH, {**base_env(data, out, 2), **ENV})], out)
    assert status == 0, text[-3000:]
    return out


def same_run(whole: Path, folder: Path, logs: list[Path]) -> None:
    """`logs` joined (a later one's steps over an earlier one's) are the uninterrupted job's
    curve, and the newest checkpoints hold the same model."""
    joined = {step: loss for log in logs for step, loss in losses(log).items()}
    expected = losses(whole / "result_0.txt")
    assert sorted(joined) == sorted(expected)
    assert [joined[s] for s in sorted(joined)] == pytest.approx(
        [expected[s] for s in sorted(expected)], rel=1e-5)
    a, b = model(whole / "ckpt"), model(folder / "ckpt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def kill_rank_after(job: subprocess.Popen, log: Path, step: int) -> int:
    """SIGKILL rank 1 of `job` once `log` has step `step`; its pid."""
    wait_for_step(job, log, step)
    pid = rank_pids(job.pid)[1]
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_for_step(job: subprocess.Popen, log: Path, step: int) -> None:
    """Until `log` has step `step` (`job` running)."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while max(losses(log), default=0) < step:
        assert time.monotonic() < deadline and job.poll() is None, job.poll()
        time.sleep(0.05)


def wait_for_file(job: subprocess.Popen, path: Path) -> None:
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while not path.exists():
        assert time.monotonic() < deadline and job.poll() is None, job.poll()
        time.sleep(0.05)


def restarted(pid: int, start: str, restart: int) -> str:
    """launch's line for a restart after rank 1 (`pid`) was killed."""
    return (f"launch: rank 1 (local rank 1, pid {pid}) died: SIGKILL; starting every rank "
            f"again from {start} (restart {restart} of 3)")


def test_a_job_restarts_after_each_crash_then_stops_at_the_warning_and_resumes(data, whole,
                                                                              tmp_path):
    """One job's life under `bertperf launch --max-restarts 3`: rank 1 killed at step 5, before
    any checkpoint: every rank starts again from the start; killed at step 18, after the
    checkpoint at 16: every rank starts again from it (the dead rank named once each time).
    Then the warning, twice, to the launcher alone (run.sub's --signal=B:USR1 path): it passes it
    to the restarted ranks, they agree on a step, write one checkpoint there, end the log
    aborted with the reason, and the job exits 75 (not restarted). RESUME_FROM=auto finishes it:
    the logs joined are the uninterrupted job's curve, the same model at the end, and the
    preempted and the resumed logs pass the checker."""
    out = tmp_path / "job"
    log = out / "result_0.txt"
    board = {"TENSORBOARD": "1"}
    with reaped(subprocess.Popen([*LAUNCH[:-1], "--max-restarts", "3", "train"],
                                 env={**base_env(data, out, 2), **ENV, **board}, cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)) as job:
        pids = [kill_rank_after(job, log, 5)]
        wait_for_file(job, out / "result_0.txt.1")  # the restarted ranks' new log
        pids.append(kill_rank_after(job, log, 18))
        wait_for_file(job, out / "result_0.txt.2")
        wait_for_step(job, log, 21)
        job.send_signal(signal.SIGUSR1)
        job.send_signal(signal.SIGUSR1)  # twice: one checkpoint, one stop
        text, _ = job.communicate(timeout=LAUNCH_TIMEOUT)
    assert job.returncode == 75, text[-3000:]
    assert "Traceback" not in text and "bertperf: error" not in text, text[-3000:]
    said = [line for line in text.splitlines() if line.startswith(("launch: ", "bertperf: "))]
    assert said == [restarted(pids[0], "the start", 1),
                    restarted(pids[1], str(out / "ckpt" / file_name(16)), 2),
                    "launch: the ranks stopped at the preemption warning, their checkpoint saved "
                    "(exit status 75)"], text[-3000:]
    [stop] = [e["metadata"] for e in events(log) if e["key"] == "run_stop"]
    step = int(stop["reason"].removeprefix("preempted, checkpoint at step "))
    assert stop["status"] == "aborted" and step % int(EVERY) == 0 and step >= 24
    assert {p.name for p in (out / "ckpt").glob("ckpt_*.pt")} == {file_name(16), file_name(step)}
    assert sorted(losses(log)) == list(range(17, step + 1))

    [(status, text)] = launch([(LAUNCH, {**base_env(data, out, 2), **ENV, **board,
                                         "RESUME_FROM": "auto"})], tmp_path)
    assert status == 0, text[-3000:]
    preempted, resumed = out / "result_0.txt.3", log
    assert min(losses(resumed)) == step + 1
    same_run(whole, out, [out / "result_0.txt.1", out / "result_0.txt.2", preempted, resumed])
    for done in (preempted, resumed):
        assert "SUCCESS" in checker(done).stderr, checker(done).stderr[-2000:]
    # TENSORBOARD=1: rank 0's event file a start; the curve joined across the crashes and the
    # warning is the uninterrupted log's, each step once (a restart hides what it trains again)
    folder = out / "result_0.txt.tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 4
    expected = losses(whole / "result_0.txt")
    assert curves(folder)["train/loss"] == [(s, pytest.approx(expected[s], rel=1e-6))
                                            for s in sorted(expected)]


def test_a_rank_dying_again_before_a_newer_checkpoint_stops_the_job(data, tmp_path):
    """Rank 1 killed at step 6, after the checkpoint at 4, and again at step 6 once every rank
    started again from it: no newer checkpoint, so the job stops with one line, not a loop."""
    out = tmp_path / "job"
    with reaped(subprocess.Popen([*LAUNCH[:-1], "--max-restarts", "3", "train"],
                                 env={**base_env(data, out, 2), **ENV, "CHECKPOINT_EVERY": "4"},
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, start_new_session=True)) as job:
        pids = [kill_rank_after(job, out / "result_0.txt", 6)]
        wait_for_file(job, out / "result_0.txt.1")
        pids.append(kill_rank_after(job, out / "result_0.txt", 6))
        text, _ = job.communicate(timeout=LAUNCH_TIMEOUT)
    assert job.returncode == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    said = [line for line in text.splitlines() if line.startswith(("launch: ", "bertperf: "))]
    newest = out / "ckpt" / file_name(4)
    assert said == [restarted(pids[0], str(newest), 1),
                    f"bertperf: error: rank 1 (local rank 1, pid {pids[1]}) died: SIGKILL, again "
                    f"with no checkpoint newer than {newest}: not restarting"], text[-3000:]
