"""The trainer with SHARDED_LAMB=1 (bertperf.optim.ShardedLamb, no DDP) on 2 gloo ranks: the first
half of the run matches a 1-rank run over the same global batches, and its checkpoint (whole
tensors, gathered from the ranks' shards) resumes with the replicated optimizer (FlatLamb under
DDP) to the 1-rank run's final weights. The data and the 1-rank run are test_train_ddp's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import torch

from tests.e2e.test_train_ddp import (GLOBAL_BATCH, STEPS, base_env, data, free_port,  # noqa: F401
                                      launch, single)


def two_ranks(files: dict, out: Path, **extra: str) -> tuple[list[float], Path]:
    """A 2-rank run (RANK/WORLD_SIZE as srun sets them); its losses and checkpoint folder."""
    out.mkdir()
    port = str(free_port())
    cmds = [([sys.executable, "-m", "bertperf", "train"],
             {**base_env(files, out, 2), "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "FLAT_LAMB": "1", **extra})
            for r in range(2)]
    results = launch(cmds, out)
    for rc, text in results:
        assert rc == 0, text[-4000:]
    text = "".join(t for _, t in results)
    return [float(x) for x in re.findall(r"step \d+ samples \d+ loss (\S+)", text)], out / "ckpt"


def test_sharded_run_resumes_with_the_replicated_optimizer(data, single, tmp_path):  # noqa: F811
    half = STEPS // 2
    losses, ckpt = two_ranks(data, tmp_path / "sharded", SHARDED_LAMB="1",
                             MAX_SAMPLES_TERMINATION=str(half * GLOBAL_BATCH))
    np.testing.assert_allclose(losses, single["loss"][:half], atol=2e-4)  # 4 decimals printed
    saved = ckpt / f"ckpt_{half:08d}.pt"
    rest, end = two_ranks(data, tmp_path / "replicated", SHARDED_LAMB="0",
                          RESUME_FROM=str(saved))
    np.testing.assert_allclose(rest, single["loss"][half:], atol=2e-4)
    final = torch.load(end / f"ckpt_{STEPS:08d}.pt", weights_only=True)["model"]
    worst = max(float((final[k] - single["model"][k]).abs().max()) for k in final)
    assert worst < 1e-5, f"final parameters differ by up to {worst:.3g}"
