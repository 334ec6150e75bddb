"""The data-parallel tests' data and their 1-rank run (test_train_ddp.py, test_train_sharded.py):
the copy task with 1 to 4 masked tokens per sample (unequal counts per rank and per micro-batch,
so that the loss normalisation by the step's global masked-token count is tested too), and
run_variant, the same run started one way or another (one rank, torchrun, `bertperf launch`,
RANK/WORLD_SIZE as srun scripts set them, mpirun, FLAT_LAMB=1, BALANCE=1) with what it gave:
eval accuracies, global batch size, every step's loss and the final weights."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertperf.formats.samples import Samples, offsets_from_lengths
from bertperf.formats.unpadded import write_shard
from tests.support.copy_task import MAX_PRED, MSL, copy_task, make_dataset
from tests.support.mlperf_logs import events
from tests.support.net import free_port
from tests.support.runs import STEPS, base_env, launch


def uneven_masks(s: Samples) -> Samples:
    """s with sample i keeping only its first 1 + (i*7 % 4) masks (the others un-masked)."""
    ids = s.input_ids.copy()
    keep = 1 + (np.arange(len(s)) * 7) % 4
    pos, lab = [], []
    for i in range(len(s)):
        p = s.mlm_positions[s.mlm_offsets[i]:s.mlm_offsets[i + 1]]
        y = s.mlm_ids[s.mlm_offsets[i]:s.mlm_offsets[i + 1]]
        ids[s.offsets[i] + p[keep[i]:]] = y[keep[i]:]
        pos.append(p[:keep[i]])
        lab.append(y[:keep[i]])
    return Samples(ids, s.offsets, s.b_starts, np.concatenate(pos), np.concatenate(lab),
                   offsets_from_lengths(keep), s.nsp)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """The copy task of 512 training samples in 2 shards, their masks made uneven."""
    root = tmp_path_factory.mktemp("ddp")
    env = make_dataset(root / "data", n_train=512, shards=2)
    train = Path(env["DATADIR_PHASE2"])
    shutil.rmtree(train)
    train.mkdir()
    s = uneven_masks(copy_task(512, seed=1))
    for i in range(2):
        write_shard(train / f"part_{i}.h5", s.take(np.arange(i * 256, (i + 1) * 256)), MSL,
                    MAX_PRED)
    return env


def outcome(out: Path, results: list[tuple[int, str]]) -> dict:
    """What a run into `out` gave, every rank having exited 0: its eval accuracies, global batch
    size, every step's loss and the model of its last checkpoint."""
    for rc, text in results:
        assert rc == 0, text[-4000:]
    log = events(out / "result_0.txt")
    text = "".join(t for _, t in results)
    state = torch.load(out / "ckpt" / f"ckpt_{STEPS}.pt" if (out / "ckpt" / f"ckpt_{STEPS}.pt")
                       .exists() else next((out / "ckpt").iterdir()), weights_only=True)
    return {"acc": [e["value"] for e in log if e["key"] == "eval_accuracy"],
            "gbs": [e["value"] for e in log if e["key"] == "global_batch_size"],
            "loss": [float(x) for x in re.findall(r"step \d+ samples \d+ loss (\S+)", text)],
            "model": state["model"]}


def run_variant(data: dict, tmp: Path, how: str) -> dict:
    """The run started `how` (single, torchrun, launch, env, flat_lamb, balance or mpirun) into
    tmp/how: its outcome."""
    out = tmp / how
    out.mkdir()
    train = [sys.executable, "-m", "bertperf", "train"]
    port = str(free_port())
    if how == "single":
        cmds = [(train, base_env(data, out, 1))]
    elif how == "torchrun":
        cmds = [([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                  "--master_addr", "127.0.0.1", "--master_port", port,
                  "-m", "bertperf", "train"], base_env(data, out, 2))]
    elif how == "launch":
        cmds = [([sys.executable, "-m", "bertperf", "launch", "--nproc-per-node", "2", "train"],
                 base_env(data, out, 2))]
    elif how in ("env", "flat_lamb", "balance"):  # what an srun script sets: ranks, world size,
        # rendezvous; FLAT_LAMB: LAMB over one flat buffer; BALANCE: samples placed by length
        flat = {"flat_lamb": {"FLAT_LAMB": "1"}, "balance": {"BALANCE": "1"}}.get(how, {})
        cmds = [(train, {**base_env(data, out, 2), "RANK": str(r), "WORLD_SIZE": "2",
                         "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         **flat})
                for r in range(2)]
    else:  # mpirun: OMPI_COMM_WORLD_* from OpenMPI itself
        env = {**base_env(data, out, 2), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        exports = [a for k in ("PYTHONPATH", "BATCHSIZE", "GRADIENT_STEPS", "LR", "MAX_STEPS",
                               "EVAL_ITER_SAMPLES", "SEED", "LOG_FREQ", "PREFETCH", "MLLOG_FILE",
                               "LOGDIR", "CHECKPOINT_DIR", "DIST_TIMEOUT", "OMP_NUM_THREADS",
                               "MASTER_ADDR", "MASTER_PORT", *data) for a in ("-x", k)]
        cmds = [(["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", *exports,
                  *train], env)]
    return outcome(out, launch(cmds, out))


@pytest.fixture(scope="module")
def single(data, tmp_path_factory) -> dict:
    """The 1-rank run, the one every other is compared with."""
    return run_variant(data, tmp_path_factory.mktemp("single"), "single")
