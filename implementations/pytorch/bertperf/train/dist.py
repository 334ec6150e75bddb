"""The process group: one process per device, DDP applied around the single-device model."""

from __future__ import annotations

import datetime
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
        if self.active and tdist.is_initialized():
            tdist.destroy_process_group()


def init(cfg: DistConfig, device: torch.device) -> Dist:
    """Join the job described by cfg (no process group for a single process)."""
    if cfg.world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        tdist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
            rank=cfg.rank, world_size=cfg.world_size,
            timeout=datetime.timedelta(seconds=cfg.timeout_s))
    return Dist(cfg.rank, cfg.world_size)
