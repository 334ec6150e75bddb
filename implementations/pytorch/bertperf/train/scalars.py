"""TENSORBOARD=1: the run's scalars (train loss, LR, throughput, eval accuracy, by optimizer
step) as TensorBoard event files in TENSORBOARD_DIR, written by rank 0 through torch's
SummaryWriter; a resumed run goes on along the same curves."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bertperf.config import RunConfig
from bertperf.formats.outputs import mark


class Scalars:
    """Where the loop's scalars go: nowhere (TENSORBOARD=0, and every rank but 0)."""

    def add(self, step: int, values: Mapping[str, float]) -> None:
        """`values` (tag: value) at optimizer step `step`."""

    def close(self) -> None:
        """Written out, the files closed."""


class TensorBoard(Scalars):
    """One SummaryWriter into `folder`, its events written out at every `add` (a crashed run
    loses none). `first_step` purges: TensorBoard hides what earlier event files in the folder
    hold from that step on (a run resumed from a checkpoint at step N, first_step N + 1: the
    steps an earlier run trained past its checkpoint, trained again now). The earlier files are
    kept."""

    def __init__(self, folder: Path, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter
        mark(folder, "tensorboard")  # the folder is this writer's (formats.outputs)
        self.writer = SummaryWriter(str(folder), purge_step=first_step)

    def add(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_scalars(cfg: RunConfig, rank: int, first_step: int) -> Scalars:
    """The run's scalars from optimizer step `first_step` on (TensorBoard)."""
    if not cfg.train.tensorboard or rank != 0:
        return Scalars()
    return TensorBoard(cfg.tensorboard_path, first_step)
