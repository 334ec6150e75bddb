"""The trainer with SHARDED_LAMB=1 (bertperf.optim.ShardedLamb, no DDP) on 2 gloo ranks: the first
half of the run matches a 1-rank run over the same global batches, and its checkpoint (whole
tensors, gathered from the ranks' shards) resumes with the replicated optimizer (FlatLamb under
DDP) to the 1-rank run's final weights, and on 1 and 4 ranks (BATCHSIZE x WORLD_SIZE kept) too.
The data and the 1-rank run are test_train_ddp's (tests/support/ddp.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.ddp import data, single  # noqa: F401
from tests.support.net import free_port
from tests.support.runs import GLOBAL_BATCH, STEPS, base_env, launch


def two_ranks(files: dict, out: Path, world: int = 2, **extra: str) -> tuple[list[float], Path]:
    """A run of `world` ranks (RANK/WORLD_SIZE as srun sets them); its losses and checkpoint
    folder."""
    out.mkdir()
    port = str(free_port())
    ranks = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port} \
        if world > 1 else {}
    cmds = [([sys.executable, "-m", "bertperf", "train"],
             {**base_env(files, out, world), **ranks, "FLAT_LAMB": "1", **extra,
              **({"RANK": str(r), "LOCAL_RANK": str(r)} if world > 1 else {})})
            for r in range(world)]
    results = launch(cmds, out)
    for rc, text in results:
        assert rc == 0, text[-4000:]
    text = "".join(t for _, t in results)
    return [float(x) for x in re.findall(r"step \d+ samples \d+ loss (\S+)", text)], out / "ckpt"


@pytest.fixture(scope="module")
def sharded_half(data, single, tmp_path_factory) -> Path:  # noqa: F811
    """The first half of the run on 2 ranks with SHARDED_LAMB=1: its last checkpoint."""
    half = STEPS // 2
    losses, ckpt = two_ranks(data, tmp_path_factory.mktemp("sharded") / "run", SHARDED_LAMB="1",
                             MAX_SAMPLES_TERMINATION=str(half * GLOBAL_BATCH))
    np.testing.assert_allclose(losses, single["loss"][:half], atol=2e-4)  # 4 decimals printed
    return ckpt / f"ckpt_{half:08d}.pt"


def test_sharded_run_resumes_with_the_replicated_optimizer(data, single, sharded_half,  # noqa: F811
                                                           tmp_path):
    half, saved = STEPS // 2, sharded_half
    rest, end = two_ranks(data, tmp_path / "replicated", SHARDED_LAMB="0",
                          RESUME_FROM=str(saved))
    np.testing.assert_allclose(rest, single["loss"][half:], atol=2e-4)
    final = torch.load(end / f"ckpt_{STEPS:08d}.pt", weights_only=True)["model"]
    worst = max(float((final[k] - single["model"][k]).abs().max()) for k in final)
    assert worst < 1e-5, f"final parameters differ by up to {worst:.3g}"


@pytest.mark.parametrize("world,sharded", [(1, "0"), (4, "1")])
def test_a_checkpoint_resumes_on_another_number_of_ranks(data, single, sharded_half,  # noqa: F811
                                                         tmp_path, world, sharded):
    """The 2-rank checkpoint goes on with 1 rank of twice the batch, or 4 ranks of half of it
    (sharded again): the same global batches, so the uninterrupted run's losses and weights."""
    rest, end = two_ranks(data, tmp_path / "resized", world, SHARDED_LAMB=sharded,
                          RESUME_FROM=str(sharded_half))
    np.testing.assert_allclose(rest, single["loss"][STEPS // 2:], atol=2e-4)
    final = torch.load(end / f"ckpt_{STEPS:08d}.pt", weights_only=True)["model"]
    worst = max(float((final[k] - single["model"][k]).abs().max()) for k in final)
    assert worst < 1e-5, f"final parameters differ by up to {worst:.3g}"
