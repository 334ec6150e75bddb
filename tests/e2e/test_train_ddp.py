"""Data parallel training through torch.distributed (gloo on CPU): a 2-rank run equals a 1-rank
run over the same global batch, whichever launcher started the ranks (torchrun, `bertperf launch`,
plain RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as Slurm's srun scripts set them, or OpenMPI's
mpirun), with FLAT_LAMB=1 (DDP reducing into FlatLamb's flat gradient buffer) and with BALANCE=1
(the same global batches, their samples placed on the ranks by length) too; and LAYOUT=stratified
trains from a `prep stratify` output on 2 ranks.

The training data is the copy task of tests/support/copy_task.py with 1 to 4 masked tokens per
sample (unequal counts per rank and per micro-batch), so the test also checks the loss normalisation
by the step's global masked-token count (bertperf/train/loop.py); data and runs:
tests/support/ddp.py. Every launch runs in its own session with a wall-clock limit and DIST_TIMEOUT
bounds each collective, so a stuck rendezvous fails the test instead of hanging it."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from tests.support.ddp import data, outcome, run_variant, single  # noqa: F401
from tests.support.net import free_port
from tests.support.runs import GLOBAL_BATCH, STEPS, base_env, launch


def assert_same(a: dict, b: dict) -> None:
    assert a["gbs"] == b["gbs"] == [GLOBAL_BATCH]
    assert len(a["acc"]) == len(b["acc"]) == STEPS * GLOBAL_BATCH // 256
    assert a["acc"] == b["acc"]  # counts of correct argmaxes: exact
    assert len(a["loss"]) == len(b["loss"]) == STEPS
    np.testing.assert_allclose(a["loss"], b["loss"], atol=2e-4)  # printed with 4 decimals
    worst = max(float((a["model"][k] - b["model"][k]).abs().max()) for k in a["model"])
    assert worst < 1e-5, f"final parameters differ by up to {worst:.3g}"
    print(f"max |param difference| {worst:.3g}; eval accuracies {a['acc']}")


@pytest.mark.parametrize("how", ["torchrun", "launch", "env", "mpirun", "flat_lamb", "balance"])
def test_two_ranks_equal_one_rank(data, single, tmp_path, how):
    if how == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("no mpirun (OpenMPI) installed")
    assert_same(run_variant(data, tmp_path, how), single)


def test_two_ranks_train_stratified_data(data, tmp_path):
    """LAYOUT=stratified (unset: read from the folder) with BALANCE=1 on 2 ranks: the run ends
    by its step cap with the same global batch size, every step's loss finite."""
    from bertperf.__main__ import main
    strat = tmp_path / "strat"
    assert main(["prep", "stratify", "--input", data["DATADIR_PHASE2"], "--output", str(strat),
                 "--bins", "12,14,16", "--shards_per_bin", "2", "--workers", "1"]) == 0
    out = tmp_path / "run"
    out.mkdir()
    env = {**base_env({**data, "DATADIR_PHASE2": str(strat)}, out, 2), "BALANCE": "1",
           "MAX_STEPS": "24", "EVAL_ITER_SAMPLES": "128", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    got = outcome(out, launch([([sys.executable, "-m", "bertperf", "train"],
                                {**env, "RANK": str(r), "LOCAL_RANK": str(r)})
                               for r in range(2)], out))
    assert got["gbs"] == [GLOBAL_BATCH] and len(got["loss"]) == 24
    assert np.isfinite(got["loss"]).all()
