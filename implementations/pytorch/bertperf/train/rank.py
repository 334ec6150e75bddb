"""`python -m bertperf rank`: this process's rank, world size and local rank as the trainer reads
them from the launcher's variables (config.DistConfig.from_env: torchrun's, then OpenMPI's, then
a Slurm step's), printed as three numbers on one line. run_and_time.sh asks this command instead
of reading the variables itself, so the script and the trainer cannot disagree on which launcher
wins (torchrun under srun, mpirun inside a Slurm job)."""

from __future__ import annotations

import argparse

from bertperf.config import DistConfig, process_environment


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    d = DistConfig.from_env(process_environment())
    print(d.rank, d.world_size, d.local_rank)
    return 0
