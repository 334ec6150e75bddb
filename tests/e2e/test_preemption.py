"""Jobs that outlive their processes, on a real two-rank job under `bertperf launch`. The
preemption warning (SIGUSR1: what Slurm's --signal sends before a job's time limit or its
preemption): the launcher forwards it to its ranks, they agree on a step, write one checkpoint
there, end the MLPerf log aborted with the reason, and the job exits 75; RESUME_FROM=auto then
finishes it on the uninterrupted job's loss curve (rtol 1e-5), to the same model, and both logs
pass the compliance checker (open division: a closed-division log of a run stopped before its
target fails the target's check). A rank killed after a checkpoint (--max-restarts): every rank
starts again from it and the job finishes on the same curve; killed again before a newer
checkpoint: the job stops with one line."""

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


def test_launch_forwards_the_warning_and_the_job_resumes_on_the_same_curve(data, whole,
                                                                          tmp_path):
    cut, env = tmp_path / "cut", ENV

    with reaped(subprocess.Popen(LAUNCH, env={**base_env(data, cut, 2), **env}, cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)) as job:
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while max(losses(cut / "result_0.txt"), default=0) < 9:
            assert time.monotonic() < deadline and job.poll() is None, job.poll()
            time.sleep(0.1)
        job.send_signal(signal.SIGUSR1)  # the launcher alone (run.sub's --signal=B:USR1 path)
        job.send_signal(signal.SIGUSR1)  # twice: one checkpoint, one stop
        out, _ = job.communicate(timeout=120)
    assert job.returncode == 75, out[-3000:]
    assert "Traceback" not in out and "bertperf: error" not in out, out[-3000:]
    [stop] = [e["metadata"] for e in events(cut / "result_0.txt") if e["key"] == "run_stop"]
    step = int(stop["reason"].removeprefix("preempted, checkpoint at step "))
    assert stop["status"] == "aborted" and step % int(EVERY) == 0 and step >= 12
    written = {file_name(step)} | ({file_name(16)} if step > 16 else set())  # CHECKPOINT_EVERY
    assert {p.name for p in (cut / "ckpt").glob("ckpt_*.pt")} == written
    assert sorted(losses(cut / "result_0.txt")) == list(range(1, step + 1))

    [(status, out)] = launch([(LAUNCH, {**base_env(data, cut, 2), **env,
                                        "RESUME_FROM": "auto"})], tmp_path)
    assert status == 0, out[-3000:]
    kept, resumed = cut / "result_0.txt.1", cut / "result_0.txt"
    assert min(losses(resumed)) == step + 1
    same_run(whole, cut, [kept, resumed])
    for log in (kept, resumed):
        assert "SUCCESS" in checker(log).stderr, checker(log).stderr[-2000:]


def kill_rank_after(job: subprocess.Popen, log: Path, step: int) -> int:
    """SIGKILL rank 1 of `job` once `log` has step `step`; its pid."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while max(losses(log), default=0) < step:
        assert time.monotonic() < deadline and job.poll() is None, job.poll()
        time.sleep(0.05)
    pid = rank_pids(job.pid)[1]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.parametrize("at, kills", [(18, 1), (18, 2), (5, 1)])
def test_a_killed_rank_restarts_the_job_from_its_checkpoint(data, whole, tmp_path, at, kills):
    """--max-restarts 3, rank 1 killed at step 18 (after the checkpoint at 16): every rank starts
    again from it, the dead rank named once, and the job finishes on the uninterrupted curve;
    killed at step 18 again, before a newer checkpoint, it stops with one line. Killed at step 5,
    before any checkpoint: every rank starts again from the start, to the same end."""
    out = tmp_path / "job"
    with reaped(subprocess.Popen([*LAUNCH[:-1], "--max-restarts", "3", "train"],
                                 env={**base_env(data, out, 2), **ENV}, cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)) as job:
        pids = [kill_rank_after(job, out / "result_0.txt", at)]
        if kills == 2:
            deadline = time.monotonic() + LAUNCH_TIMEOUT
            while not (out / "result_0.txt.1").exists():  # the restarted ranks' new log
                assert time.monotonic() < deadline and job.poll() is None
                time.sleep(0.05)
            pids.append(kill_rank_after(job, out / "result_0.txt", at))
        text, _ = job.communicate(timeout=LAUNCH_TIMEOUT)
    said = [line for line in text.splitlines() if line.startswith(("launch: ", "bertperf: "))]
    died = f"rank 1 (local rank 1, pid {pids[0]}) died: SIGKILL"
    start = out / "ckpt" / file_name(16) if at > 16 else "the start"
    assert said[0] == f"launch: {died}; starting every rank again from {start} (restart 1 of " \
        "3)", text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    if kills == 1:
        assert job.returncode == 0 and len(said) == 1, text[-3000:]
        same_run(whole, out, [out / "result_0.txt.1", out / "result_0.txt"])
    else:
        assert job.returncode == 1, text[-3000:]
        assert said[1:] == [f"bertperf: error: rank 1 (local rank 1, pid {pids[1]}) died: "
                            f"SIGKILL, again with no checkpoint newer than "
                            f"{out / 'ckpt' / file_name(16)}: not restarting"], text[-3000:]
