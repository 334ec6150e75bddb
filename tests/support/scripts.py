"""The repository's launch scripts as a test drives them: the variables a config file exports
(config_env), run_and_time.sh run with a given environment, the launchers' rank variables that
must not leak from the test process into a job (LAUNCH_VARS), and CONFIG, the CPU job's config
(config_CPU_1x2x32x1.sh: 2 ranks, gloo) that the end-to-end tests shorten."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.paths import ROOT

CONFIG = ROOT / "config_CPU_1x2x32x1.sh"
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
               "SLURM_LOCALID", "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
               "OMPI_COMM_WORLD_LOCAL_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")


def config_env(path: Path, env: dict | None = None) -> dict:
    """The variables a config file exports (sourced by bash, as a user does)."""
    out = subprocess.run(["bash", "-c", f'set -a; source "{path}"; env -0'], cwd=ROOT,
                         capture_output=True, check=True, env=env)
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


def run_and_time(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "run_and_time.sh"), *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
