"""`sbatch run.sub` across two "nodes" made of network namespaces under one Slurm controller
(tests/support/netns_cluster.py), 2 ranks a node: a job run to its end passes the compliance
checker; a job warned mid-run (Slurm's --signal) checkpoints, requeues itself and finishes on
the same loss curve. The copy task of tests/support/launch.py keeps each run to seconds."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from bertperf.train.checkpoint import newest_first
from tests.e2e.test_multinode import sbatch_run_sub, two_node_env
from tests.support.launch import assert_compliant, data  # noqa: F401
from tests.support.mlperf_logs import events
from tests.support.netns_cluster import NetnsSlurmCluster, netns_cluster  # noqa: F401
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


KEEP = {"LOG_FREQ": "1", "PREEMPT_CHECK_EVERY": "2"}
"""What the uninterrupted job and the warned one share beyond two_node_env: a loss a step."""


@pytest.fixture(scope="module")
def uninterrupted(netns_cluster: NetnsSlurmCluster, data, tmp_path_factory  # noqa: F811
                  ) -> tuple[Path, Path, object, str]:
    """`sbatch run.sub` across the two nodes, run to its end: (its log, its checkpoint folder,
    the job's result, its output)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    logdir, ckpt = tmp / "results", tmp / "ckpt"
    job = sbatch_run_sub(netns_cluster, two_node_env(data, logdir, CHECKPOINT_DIR=str(ckpt),
                                                     **KEEP), tmp / "slurm.out")
    result = netns_cluster.wait(job, timeout=240)
    return logdir / "result_mn_1.txt", ckpt, result, (tmp / "slurm.out").read_text()


def test_sbatch_run_sub_trains_across_two_nodes(uninterrupted):
    log, _, result, out = uninterrupted
    assert (result.state, result.exit_code) == ("COMPLETED", 0), out[-4000:]
    assert result.fields["NodeList"] == "n[1-2]"
    assert "global batch 16 (4 ranks" in out
    assert_compliant(log, "aborted")


def logged_steps(log: Path, resumed: bool) -> int:
    """train_loss events in a log being written (0 while a line is half there), and in a
    resumed run's only (0 while the log is still the earlier run's)."""
    try:
        logged = events(log) if log.exists() else []
    except ValueError:
        return 0
    if resumed and not any(e["key"] == "resumed" for e in logged):
        return 0
    return len([e for e in logged if e["key"] == "train_loss"])


def warn_and_requeue(cluster: NetnsSlurmCluster, job: str, log: Path, steps: int, whom: str,
                     restarts: int, out: Path) -> None:
    """Once `log` has `steps` losses (the requeued run's after a first requeue), Slurm's warning
    to `whom` (scancel --signal=USR1 --batch/--full); then wait for run.sub's requeue (the job
    pending, `restarts` restarts, both nodes idle) and let it start at once."""
    deadline = time.monotonic() + 180
    while logged_steps(log, resumed=restarts > 1) < steps:
        assert time.monotonic() < deadline, out.read_text()[-3000:] if out.exists() else job
        time.sleep(0.2)
    cluster.run(["scancel", "--signal=USR1", whom, job])
    deadline = time.monotonic() + 120  # requeued, Slurm holds it 2 min (BeginTime): not here
    while (cluster.job(job).get("Restarts"), cluster.job(job).get("JobState"),
           cluster.run(["sinfo", "-h", "-N", "-o", "%T"]).stdout.split()) != \
            (str(restarts), "PENDING", ["idle"] * 2):
        assert time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.2)
    time.sleep(5)  # sooner, a node may still refuse the job ("already killed")
    cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])


def test_the_warning_checkpoints_requeues_and_the_job_finishes_by_itself(
        netns_cluster: NetnsSlurmCluster, data, tmp_path, uninterrupted):  # noqa: F811
    """Slurm's warning, first to the batch shell alone (scancel --signal=USR1 --batch, what
    --signal=B:USR1@N sends before the time limit: run.sub passes it on to the 4 ranks), then,
    once the requeued job has trained a few steps, to every process of the job at once
    (--full: the batch shell, srun, the console's tee, every rank). Each time the ranks
    checkpoint at a step they agree on and end their log aborted ("preempted, checkpoint at step
    N"), run.sub requeues the job, and the requeued job resumes that trial with RESUME_FROM=auto;
    the second finishes it: a compliant log of a resumed run, the preempted ones kept beside it,
    their loss curve joined the uninterrupted job's (rtol 1e-5), the same model at the end."""
    logdir, ckpt = tmp_path / "results", tmp_path / "ckpt"
    env = two_node_env(data, logdir, CHECKPOINT_DIR=str(ckpt), **KEEP)
    out = tmp_path / "job.out"
    job = netns_cluster.sbatch(ROOT / "run.sub", "--nodes=2", "--ntasks-per-node=2",
                               f"--output={out}", env=env, cwd=ROOT)  # run.sub's --requeue
    log = logdir / "result_mn_1.txt"
    warn_and_requeue(netns_cluster, job, log, 5, "--batch", 1, out)
    warn_and_requeue(netns_cluster, job, log, 3, "--full", 2, out)
    result = netns_cluster.wait(job, timeout=240)
    text = out.read_text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), (result, text[-4000:])
    assert result.fields["Restarts"] == "2", result.fields
    assert text.count(f"trial 1 stopped at the preemption warning; requeueing job {job}") == 2
    kept = [logdir / "result_mn_1.txt.1", logdir / "result_mn_1.txt.2"]
    stops = []
    for earlier in kept:
        [stop] = [e["metadata"] for e in events(earlier) if e["key"] == "run_stop"]
        assert stop["status"] == "aborted", stop
        stops.append(int(stop["reason"].removeprefix("preempted, checkpoint at step ")))
    assert stops[0] < stops[1] and all(step % 2 == 0 for step in stops), stops
    console = (logdir / "mn_1.log").read_text()  # every attempt's lines, to its end
    for step in stops:
        assert f"run_stop: aborted, preempted, checkpoint at step {step} after" in console, \
            console[-3000:]
    assert [e["metadata"]["step"] for e in events(kept[1]) if e["key"] == "resumed"] == \
        [stops[0]]
    assert [e["metadata"]["step"] for e in events(log) if e["key"] == "resumed"] == [stops[1]]
    assert_compliant(log, "aborted")
    whole_log, whole_ckpt, whole, _ = uninterrupted
    assert whole.state == "COMPLETED"
    joined = {**step_losses(kept[0]), **step_losses(kept[1]), **step_losses(log)}
    expected = step_losses(whole_log)
    assert sorted(joined) == sorted(expected)
    assert [joined[s] for s in sorted(joined)] == pytest.approx(
        [expected[s] for s in sorted(expected)], rel=1e-5)
    a, b = (torch.load(newest_first(c)[0], weights_only=True)["model"]
            for c in (whole_ckpt, ckpt))
    for k in a:  # not bitwise: a new DDP's first step buckets the gradients otherwise, and a
        # 4-rank gloo ring then adds some elements in another order (2 ranks: bitwise,
        # tests/e2e/test_preemption.py). Measured: the attention key biases differ by up to
        # 2e-5 (their gradient is zero in exact arithmetic, so LAMB steps on rounding), every
        # other tensor by under 1e-6.
        torch.testing.assert_close(a[k], b[k], rtol=1e-5,
                                   atol=1e-4 if k.endswith("self.key.bias") else 1e-5, msg=k)


def step_losses(log: Path) -> dict[int, float]:
    return {e["metadata"]["step"]: e["value"] for e in events(log) if e["key"] == "train_loss"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
