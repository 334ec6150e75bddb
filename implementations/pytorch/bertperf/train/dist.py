"""The process group: one process per device, DDP applied around the single-device model."""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

import torch
import torch.distributed as tdist

from bertperf.config import DistConfig


@dataclass
class Dist:
    """This process's rank and world size, and the sum over ranks (identity when alone)."""

    rank: int
    world_size: int

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """values summed over ranks (a new tensor; float64 keeps integer counts exact)."""
        out = values.clone()
        if self.active:
            tdist.all_reduce(out)
        return out

    def close(self) -> None:
        """Leave the group. The barrier and the pause let gloo's worker threads finish releasing
        the last collectives' tensors (which takes the GIL) before the group's destructor joins
        those threads while holding the GIL; without them a rank could hang at exit."""
        if self.active and tdist.is_initialized():
            tdist.barrier()
            time.sleep(0.2)
            tdist.destroy_process_group()


def init(cfg: DistConfig, device: torch.device) -> Dist:
    """Join the job described by cfg (no process group for a single process)."""
    if cfg.world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # torchrun: its agent serves the store on MASTER_ADDR:MASTER_PORT, join it (env://);
        # srun / mpirun / hand-set RANK+WORLD_SIZE: rank 0 opens the store there (tcp://).
        init_method = "env://" if cfg.launcher_store else \
            f"tcp://{cfg.master_addr}:{cfg.master_port}"
        tdist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo", init_method=init_method,
            rank=cfg.rank, world_size=cfg.world_size,
            timeout=datetime.timedelta(seconds=cfg.timeout_s))
    return Dist(cfg.rank, cfg.world_size)
