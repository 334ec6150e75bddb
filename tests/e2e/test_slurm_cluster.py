"""The local Slurm cluster of slurm_cluster.py works: sbatch + srun launch tasks with the usual
SLURM_* variables, a failing batch script is reported FAILED with its exit code, srun-launched
Python ranks form a torch.distributed gloo group, and tear-down leaves no process behind."""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.slurm_cluster import SlurmCluster, local_slurm_cluster

JOB_TIMEOUT = 60


def test_srun_two_tasks(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    script = textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --ntasks=2 --nodes=1
        #SBATCH --output={out}
        set -e
        srun hostname
        export FROM_BATCH=exported
        srun bash -c 'echo task $SLURM_PROCID $SLURM_NTASKS $SLURM_LOCALID $FROM_BATCH'
        """)
    job = slurm_cluster.sbatch(script, cwd=tmp_path)
    res = slurm_cluster.wait(job, JOB_TIMEOUT)
    text = out.read_text()
    assert (res.state, res.exit_code) == ("COMPLETED", 0), text
    lines = text.splitlines()
    tasks = sorted(line.split()[1:] for line in lines if line.startswith("task "))
    assert tasks == [["0", "2", "0", "exported"], ["1", "2", "1", "exported"]], text
    hosts = [line for line in lines if not line.startswith("task ")]
    assert len(hosts) == 2 and len(set(hosts)) == 1, text


def test_failed_job_exit_code(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("#!/bin/bash\necho failing\nexit 3\n",
                               f"--output={tmp_path / 'out.txt'}", cwd=tmp_path)
    res = slurm_cluster.wait(job, JOB_TIMEOUT)
    assert (res.state, res.exit_code, res.signal) == ("FAILED", 3, 0)
    assert (tmp_path / "out.txt").read_text() == "failing\n"


WORKER = """\
import datetime, json, os, sys
import torch
import torch.distributed as dist
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(rank + 1), 10.0 ** rank])
dist.all_reduce(t)
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"world": dist.get_world_size(), "sum": t.tolist()}, f)
dist.destroy_process_group()
"""


def test_srun_torch_gloo(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "worker.py").write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --ntasks=2 --nodes=1 --time=2
        #SBATCH --output={tmp_path / 'out.txt'}
        export MASTER_ADDR=localhost MASTER_PORT=$PORT_FROM_TEST GLOO_SOCKET_IFNAME=lo
        srun {sys.executable} worker.py result.json
        """)
    job = slurm_cluster.sbatch(script, cwd=tmp_path, env={"PORT_FROM_TEST": str(port)})
    res = slurm_cluster.wait(job, JOB_TIMEOUT)
    assert (res.state, res.exit_code) == ("COMPLETED", 0), (tmp_path / "out.txt").read_text()
    assert json.loads((tmp_path / "result.json").read_text()) == {"world": 2,
                                                                   "sum": [3.0, 11.0]}


def _processes_with(marker: bytes) -> dict[int, str]:
    """pid -> command line of the processes whose environment holds marker."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        with open(f"/proc/{d}/cmdline", "rb") as g:
                            procs[int(d)] = g.read().replace(b"\0", b" ").decode().strip()
            except OSError:
                pass
    return procs


def test_teardown_leaves_nothing(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A second, private cluster (beside the session one) stopped with a job still running:
    its daemons, slurmstepd and the job's processes are all gone, and so is its directory."""
    with local_slurm_cluster() as c:
        assert c.conf != slurm_cluster.conf
        marker = f"SLURM_CONF={c.conf}".encode()
        root = c.root
        job = c.sbatch("#!/bin/bash\nsrun sleep 300\n", f"--output={tmp_path / 'out.txt'}",
                       cwd=tmp_path)
        deadline = time.monotonic() + JOB_TIMEOUT
        while not any(cmd.endswith("sleep 300") and not cmd.startswith("srun")
                      for cmd in _processes_with(marker).values()):
            assert time.monotonic() < deadline, c.job(job)
            time.sleep(0.2)
        assert {"slurmctld", "slurmd", "munged"} <= {
            os.path.basename(cmd.split()[0]) for cmd in _processes_with(marker).values()}
    assert root is not None and not root.exists()
    assert _processes_with(marker) == {}
