"""Real runs of `python -m bertperf train` on the copy task (copy_task.py), as child processes:
`train`, one rank with the converging recipe of the compliance tests (GBS 16, LR 0.02, an eval
every 320 samples: MLPerf's 0.720 within 3,000 samples); `base_env`, the recipe of the
data-parallel tests (global batch 16 in 2 micro-batches, 96 steps, a checkpoint at the end) for
`world` ranks; and `launch`, which starts commands each in its own session and kills what is left
after LAUNCH_TIMEOUT seconds, so a stuck rendezvous fails a test instead of hanging it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.copy_task import make_dataset
from tests.support.paths import PYTHONPATH

LAUNCH_TIMEOUT = 180
GLOBAL_BATCH, GA, STEPS = 16, 2, 96
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")
"""What would make a child of the test process take itself for a rank of some job."""


def train_env(tmp_path: Path, data: dict | None = None, **env: str) -> dict:
    """`train`'s environment: one rank on `data` (make_dataset's; default a fresh copy task
    under tmp_path), `env` on top, its log tmp_path/result_0.txt."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = data or make_dataset(tmp_path / "data")
    return {**{k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")},
            **data, "PYTHONPATH": PYTHONPATH, "BATCHSIZE": "16", "LR": "0.02", "MAX_STEPS": "600",
            "EVAL_ITER_SAMPLES": "320", "SEED": "0", "LOG_FREQ": "20",
            "MLLOG_FILE": str(tmp_path / "result_0.txt"), "LOGDIR": str(tmp_path), **env}


def train(tmp_path: Path, data: dict | None = None, **env: str
          ) -> tuple[subprocess.CompletedProcess, Path]:
    """One rank (train_env) in tmp_path: (the run, its MLPerf log)."""
    full = train_env(tmp_path, data, **env)
    run = subprocess.run([sys.executable, "-m", "bertperf", "train"], env=full, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    return run, Path(full["MLLOG_FILE"])


SEVERAL = """
import json, sys
from bertperf import config
from bertperf.train import loop
for env in json.load(sys.stdin):
    print(loop.main(config.load(env)), flush=True)
"""


def train_in_one_process(envs: list[dict]) -> subprocess.CompletedProcess:
    """Runs of train_env's environments one after another in one process (loop.main each, as
    `train` calls it): the imports, most of a tiny run's time, paid once. Its stdout: each
    run's exit status, a line each. The process's own environment is the first run's."""
    import json
    return subprocess.run([sys.executable, "-c", SEVERAL], input=json.dumps(envs), env=envs[0],
                          cwd=Path(envs[0]["LOGDIR"]), capture_output=True, text=True,
                          timeout=300)


def base_env(data: dict, out: Path, world: int) -> dict:
    """The environment of one of `world` ranks training on `data` into `out` (its log
    result_0.txt, its checkpoints in ckpt/), without this process's rank variables."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    return {**env, **data, "PYTHONPATH": PYTHONPATH, "BATCHSIZE": str(GLOBAL_BATCH // GA // world),
            "GRADIENT_STEPS": str(GA), "LR": "0.02", "MAX_STEPS": str(STEPS),
            "EVAL_ITER_SAMPLES": "256", "SEED": "0", "LOG_FREQ": "1", "PREFETCH": "1",
            "MLLOG_FILE": str(out / "result_0.txt"), "LOGDIR": str(out),
            "CHECKPOINT_DIR": str(out / "ckpt"), "DIST_TIMEOUT": "60", "OMP_NUM_THREADS": "1"}


def launch(cmds: list[tuple[list[str], dict]], cwd: Path) -> list[tuple[int, str]]:
    """Start every command in its own session; wait for all within LAUNCH_TIMEOUT seconds, then
    kill what is left (the whole process group: torchrun's and mpirun's children too)."""
    procs = [subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for cmd, env in cmds]
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=LAUNCH_TIMEOUT)
            results.append((p.returncode, out))
    except subprocess.TimeoutExpired:
        pytest.fail(f"launch {[c for c, _ in cmds]} still running after {LAUNCH_TIMEOUT} s")
    finally:
        for p in procs:  # SIGTERM first: torchrun and mpirun pass it on to their ranks
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    return results


@contextlib.contextmanager
def reaped(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """`proc` (started in its own session), its whole process group killed on the way out if it
    is still running: a failed assertion leaves no ranks behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
