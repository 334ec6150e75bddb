"""Multi-node for real on one machine: two "nodes" made of network namespaces under one Slurm
controller (tests/support/netns_cluster.py). `mpirun` starts config_CPU_1x2x32x1.sh's job across
the two namespaces (2 ranks a node, gloo across the nodes' addresses) and its log passes the
compliance checker; cutting one node's link in the middle of a run ends the job within the
collective timeout with an error naming the lost ranks, and the last checkpoint then resumes to
a compliant finish (`sbatch run.sub` across them: tests/e2e/test_requeue.py). The copy task of
tests/support/launch.py keeps each run to seconds."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.launch import CAPPED, assert_compliant, data, job_env  # noqa: F401
from tests.support.mlperf_logs import events
from tests.support.net import free_port
from tests.support.netns_cluster import NetnsSlurmCluster, netns_cluster  # noqa: F401
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def two_node_env(data: dict, logdir: Path, **extra: str) -> dict:  # noqa: F811
    """The CPU config on 2 nodes x 2 ranks, CAPPED: BATCHSIZE 4 keeps test_launch's global
    batch 16."""
    return job_env(data, logdir, **{"DGXNNODES": "2", "BATCHSIZE": "4", "NEXP": "1",
                                    "CLEAR_CACHES": "0", "MASTER_PORT": str(free_port()),
                                    "DATESTAMP": "mn", **CAPPED, **extra})


def sbatch_run_sub(cluster: NetnsSlurmCluster, env: dict, out: Path) -> str:
    # --no-requeue: a job of a node that failed ends (Slurm's default puts it back in the queue)
    return cluster.sbatch(ROOT / "run.sub", "--nodes=2", "--ntasks-per-node=2", "--no-requeue",
                          f"--output={out}", env=env, cwd=ROOT)


def test_mpirun_across_the_two_namespaces(netns_cluster: NetnsSlurmCluster, data,  # noqa: F811
                                          tmp_path):
    """OpenMPI's own launcher: its agent enters each node (its namespace, under its host name)
    instead of ssh (there is none between namespaces), its out-of-band and TCP traffic stays on
    the cluster's subnet, and gloo binds the nodes' interface. Daemons that share a host name
    share Open MPI's session folder for it: on one machine they failed to start in 9 of 100
    two-node starts (a folder gone from under one daemon, or a segfault in hwloc over the
    topology they share), and in none of 360 with a name each."""
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun (OpenMPI) installed")
    agent = netns_cluster.remote_shell(tmp_path / "netns-agent.sh")
    logdir = tmp_path / "results"
    env = {**two_node_env(data, logdir), "MASTER_ADDR": netns_cluster.address(1),
           "LAUNCHER": "mpirun", "OMPI_MCA_plm_rsh_agent": str(agent),
           "OMPI_MCA_oob_tcp_if_include": str(netns_cluster.net),
           "OMPI_MCA_btl_tcp_if_include": str(netns_cluster.net),
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "MPIRUN_ARGS": "-H n1:2,n2:2",
           "GLOO_SOCKET_IFNAME": "eth0"}
    run = subprocess.run(["bash", str(ROOT / "run_and_time.sh")], env=env, cwd=tmp_path,
                         check=False, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    logs = list(logdir.glob("result_*.txt"))
    assert len(logs) == 1, logs
    assert_compliant(logs[0], "aborted")


def test_a_cut_link_ends_the_job_naming_the_lost_ranks_and_the_run_resumes(
        netns_cluster: NetnsSlurmCluster, data, tmp_path):  # noqa: F811
    logdir, ckpt = tmp_path / "results", tmp_path / "ckpt"
    env = two_node_env(data, logdir, DIST_TIMEOUT="8", CHECKPOINT_DIR=str(ckpt),
                       CHECKPOINT_EVERY="20", LOG_FREQ="5")
    job = sbatch_run_sub(netns_cluster, env, tmp_path / "cut.out")
    deadline = time.monotonic() + 180
    while not list(ckpt.glob("ckpt_*.pt")):
        assert time.monotonic() < deadline, (tmp_path / "cut.out").read_text()[-3000:]
        assert netns_cluster.job(job)["JobState"] in ("PENDING", "RUNNING"), \
            (tmp_path / "cut.out").read_text()[-3000:]
        time.sleep(0.2)
    netns_cluster.cut(2)
    cut_at = time.monotonic()
    try:
        result = netns_cluster.wait(job, timeout=120)
    finally:
        netns_cluster.mend(2)
    ended = time.monotonic() - cut_at
    out = (tmp_path / "cut.out").read_text() + "".join(
        p.read_text() for p in logdir.glob("mn_*.log"))
    assert result.state != "COMPLETED", out[-3000:]
    assert "a collective failed" in out and "ranks 2, 3 (on n2) silent for" in out, out[-4000:]
    assert ended < 90, f"the job ended {ended:.0f} s after the link went down"
    print(f"job ended {ended:.1f} s after the cut:",
          *[line for line in out.splitlines() if "silent for" in line], sep="\n")
    stops = [e["metadata"]["status"] for e in events(logdir / "result_mn_1.txt")
             if e["key"] == "run_stop"]
    assert stops == ["aborted"]

    # n2 back in service, the same job again from the last checkpoint
    deadline = time.monotonic() + 90
    while netns_cluster.run(["sinfo", "-h", "-N", "-o", "%T"]).stdout.split() != ["idle"] * 2:
        assert time.monotonic() < deadline, netns_cluster.logs()
        time.sleep(0.5)
    again = sbatch_run_sub(netns_cluster, {**env, "RESUME_FROM": "auto", "DATESTAMP": "mn2"},
                           tmp_path / "resume.out")
    result = netns_cluster.wait(again, timeout=240)
    resumed = (tmp_path / "resume.out").read_text()
    assert (result.state, result.exit_code) == ("COMPLETED", 0), resumed[-4000:]
    log = logdir / "result_mn2_1.txt"
    assert [e for e in events(log) if e["key"] == "resumed"]
    assert_compliant(log, "aborted")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
